"""The data of one chain run: what a request acts on, what Execute may use, what it returns.

Kept apart from ``chain.py`` so the stages (``authz.decide``, ``approvals.redeem``,
``audit.recording``) can take these types without importing the chain that calls them.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Any

from aiohttp import web

from .approvals.binding import resource_hash
from .authn.principal import Principal
from .authz import actions
from .authz.decision import Decision
from .config import Config
from .store.base import Store, TicketRecord, Tx

__all__ = ["AS_SENT", "Outcome", "Protection", "Run", "Target", "TargetOf", "Write"]

#: ``Target.value`` default: the policy sees the resource as the request sent it.
AS_SENT: Any = object()


@dataclass(frozen=True)
class Target:
    """What a request acts on: the resource value (hashed for bindings) and the environment."""

    resource: Any
    env: str
    id: str | None = None
    owner: str | None = None  # the subject a resource belongs to (a ticket's subject)
    attributes: dict[str, Any] | None = None
    #: The stored record the target was read from (a ticket, a task), for handlers that only
    #: read it. Writers re-read inside their transaction.
    record: Any = field(default=None, compare=False, repr=False)
    #: ``input.resource.value`` when it is not the resource itself (``AS_SENT``): a route whose
    #: resource is a whole document gives the policy a bounded summary of it (compose import).
    value: Any = field(default=AS_SENT, compare=False, repr=False)
    #: Called by the chain once AuthZ did not deny, before Approval: what a route keeps only for
    #: a request the policy lets through (a policy candidate its ticket's reviewers will read).
    authorized: Callable[[], Awaitable[None]] | None = field(default=None, compare=False,
                                                            repr=False)

    @functools.cached_property
    def hash(self) -> str:
        """``sha256:`` of the RFC 8785 canonical JSON of the resource (computed once)."""
        return resource_hash(self.resource)

    @classmethod
    def collection(cls, name: str, env: str) -> Target:
        """The target of a listing: the resource ``{"collection": name}``, whose hash is the
        same for every request (computed once per name, not per request).

        Every listing request makes one: filled in directly (a frozen dataclass's ``__init__``
        sets each of its eight fields through ``object.__setattr__``, ~3x the cost), with the
        same fields as ``cls(resource=..., env=env)`` (``tests/authz/test_decide.py`` holds
        them equal)."""
        target = object.__new__(cls)
        target.__dict__.update(_COLLECTION_DEFAULTS, resource={"collection": name}, env=env,
                               hash=_collection_hash(name))  # where cached_property keeps it
        return target

    def policy_resource(self, action: actions.Action) -> dict[str, Any]:
        """The ``resource`` member of the policy input (its kind is the action's, from the
        catalogue): ``value`` is the resource as sent (the value ``hash`` covers), already
        bounded by ``service.limits`` where the body was read."""
        doc: dict[str, Any] = {"id": self.id, "kind": action.resource_kind, "hash": self.hash,
                               "value": self.resource if self.value is AS_SENT else self.value}
        if self.owner is not None:
            doc["owner"] = self.owner
        if self.attributes:
            doc["attributes"] = self.attributes
        return doc


@functools.lru_cache(maxsize=64)
def _collection_hash(name: str) -> str:
    return resource_hash({"collection": name})


#: The fields of a ``Target`` with their defaults, but ``resource`` and ``env`` (``collection``).
_COLLECTION_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(Target) if f.name not in ("resource", "env")}


@dataclass
class Run:
    """Everything a read's Execute step may use."""

    request: web.Request
    config: Config
    store: Store
    principal: Principal
    body: Any
    target: Target
    decision: Decision
    correlation_id: str
    now: float
    ticket: TicketRecord | None = None


@dataclass
class Write(Run):
    """A mutating run: ``tx`` is the transaction that also consumes the ticket and commits the
    audit record. Write through it, never through ``store``."""

    tx: Tx = field(kw_only=True)

    @classmethod
    def of(cls, run: Run, tx: Tx) -> Write:
        """``run`` with the transaction it writes through."""
        return cls(**{f.name: getattr(run, f.name) for f in fields(Run)}, tx=tx)


@dataclass
class Outcome:
    """The Execute step's result: the response, and what the audit record should add."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    audit: dict[str, Any] = field(default_factory=dict)
    #: For streamed responses (server-sent events): produces the response after audit commits.
    stream: Callable[[], Awaitable[web.StreamResponse]] | None = None
    #: ``body`` already serialised (``json.dumps(body)``, e.g. kept with a cached report): sent
    #: as it is instead of serialising ``body`` again.
    text: str | None = None
    #: Run (in the background) if the run committed but its answer was lost with the answer to
    #: its COMMIT: undoes what only that answer made usable (a ticket whose nonce nobody got).
    if_unanswered: Callable[[], Awaitable[None]] | None = None


#: Reads a request's target; may await the store (e.g. the ticket a review is about).
TargetOf = Callable[[web.Request, Any], Awaitable[Target]]


@dataclass(frozen=True)
class Protection:
    """A route's declaration: its catalogue action, body schema and how to read its target."""

    action: actions.Action
    target: TargetOf
    body_schema: str | None
