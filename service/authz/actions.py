"""The action catalogue: every protected action's name and whether it mutates (code-owned)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["ACTIONS", "Action", "all_actions", "get"]


@dataclass(frozen=True)
class Action:
    """One protected action.

    ``mutating`` says the action changes state. ``ticketed`` says a production ``allow`` is
    upgraded to ``require_approval`` by the engine whatever the policy returns; it defaults to
    ``mutating``. The approval workflow's own actions are mutating but not ticketed: a ticket to
    create or review a ticket would never end. ``tasks.report`` only records progress of an
    execution that was already authorised (and ticketed) and is not ticketed either.
    """

    name: str
    mutating: bool
    description: str
    #: ``input.resource.kind`` of this action's requests: code-owned here, so the input of a
    #: request and the input evaluated when a ticket for it is created can never differ.
    resource_kind: str
    ticketed: bool | None = None

    @property
    def needs_ticket_in_production(self) -> bool:
        return self.mutating if self.ticketed is None else self.ticketed


_CATALOGUE: tuple[Action, ...] = (
    Action("installer.run.execute", True, "run an installer step against an environment", "installer_run"),
    Action("approvals.create", True, "request an approval ticket", "approval_ticket", ticketed=False),
    Action("approvals.review", True, "approve or reject a pending ticket", "approval_ticket", ticketed=False),
    Action("approvals.revoke", True, "revoke a pending or approved ticket", "approval_ticket",
           ticketed=False),
    Action("approvals.read", False, "read one approval ticket", "approval_ticket"),
    Action("approvals.list", False, "list approval tickets", "approval_list"),
    Action("compose.import", False, "validate a compose file and report (no side effects)",
           "compose_file"),
    Action("databases.list", False, "list database inventory", "databases"),
    Action("storage.list", False, "list storage objects inventory", "storage"),
    Action("tasks.read", False, "read a task, its state and step events", "task"),
    Action("tasks.report", True, "append progress/step events to a running task", "task",
           ticketed=False),
    Action("audit.read", False, "read and verify the audit log", "audit_log"),
    Action("policy.read", False, "list published policy revisions and the active one",
           "policy_revisions"),
    Action("policy.publish", True, "store a signed policy revision (it does not activate it)",
           "policy_revision"),
    Action("policy.activate", True, "make a published revision the fleet's active one (also "
           "rollback)", "policy_revision"),
)

#: name -> Action, for every action the service knows.
ACTIONS: dict[str, Action] = {a.name: a for a in _CATALOGUE}


def get(name: str) -> Action:
    """The catalogue entry for ``name``; ``KeyError`` for an unknown action."""
    return ACTIONS[name]


def all_actions() -> Iterator[Action]:
    """Every action in catalogue order."""
    return iter(_CATALOGUE)
