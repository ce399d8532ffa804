"""The ticket state machine: the states an approval ticket can be in and the moves between them.

The store enforces it: every state change is one conditional ``UPDATE ... WHERE state IN (...)``
built from this table, so the database, not this module, decides which of two racing moves wins.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

__all__ = ["TICKET_STATES", "TICKET_TRANSITIONS", "TicketState"]

TicketState: TypeAlias = Literal["pending", "approved", "rejected", "expired", "revoked", "consumed"]

TICKET_STATES: tuple[TicketState, ...] = (
    "pending",
    "approved",
    "rejected",
    "expired",
    "revoked",
    "consumed",
)

# Terminal states have no way out; 'approved' is entered only through a review (it sets the use-by
# time) and 'consumed' only through consumption (it checks the binding), so the store's generic
# transition refuses both as targets.
TICKET_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"approved", "rejected", "expired", "revoked"}),
    "approved": frozenset({"consumed", "expired", "revoked"}),
    "rejected": frozenset(),
    "expired": frozenset(),
    "revoked": frozenset(),
    "consumed": frozenset(),
}
