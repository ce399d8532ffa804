"""The store contract: record types, HTTP-free errors and the ``Store`` / ``Tx`` protocols.

Both backends (``sqlite.py``, ``postgres.py``) implement these protocols over the shared SQL in
the ``sql`` package. The operations come in one protocol per record kind (``SessionOps``,
``TicketOps``, ``TaskOps``, ``AuditOps``, ``OutboxOps``); ``Tx`` and ``Store`` are those kinds composed, so a
caller calls ``store.get_ticket(...)`` or ``tx.consume_ticket(...)`` alike. Nothing here knows
about HTTP: ``service/errors.py`` maps the errors to problem+json
(``NotFound`` -> 404, ``Conflict`` -> 409, ``StoreOutcomeUnknown`` -> 503 ``outcome_unknown``,
``StoreUnavailable`` -> 503 ``store_unavailable``).

Rules every method follows:

* Timestamps are float unix seconds passed in by the caller (``now`` / ``at``); the store never
  reads the clock, so tests control time and all replicas agree on what "expired" means for one
  request.
* Every method is atomic. ``Store.transaction()`` yields a ``Tx`` with the same operations, all of
  which commit together or not at all (ticket consumption + step event + audit record).
* JSON columns hold ``dict`` / ``list`` (or, for a ticket's ``resource``, also a string).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias

from ..approvals.states import TicketState

__all__ = [
    "AUDIT_GENESIS_HASH",
    "MAX_PAGE",
    "AuditCheckpoint",
    "AuditOps",
    "AuditRecord",
    "ChainGuard",
    "CheckedEntry",
    "CheckpointSigner",
    "Conflict",
    "DeliveryRecord",
    "EventRecord",
    "FederatedSession",
    "FederatedSubject",
    "FederationOps",
    "HandoffRecord",
    "Json",
    "NotFound",
    "OidcLoginRecord",
    "OutboxEvent",
    "OutboxOps",
    "OutboxState",
    "PolicyActivation",
    "PolicyRevisionOps",
    "PolicyRevisionRecord",
    "PublishedKey",
    "PublishedKeyOps",
    "ReviewRecord",
    "RunRead",
    "Seal",
    "SessionOps",
    "SessionRecord",
    "StaleStart",
    "Store",
    "StoreError",
    "StoreOutcomeUnknown",
    "StoreUnavailable",
    "TaskOps",
    "TaskRead",
    "TaskRecord",
    "ThrottleRule",
    "ThrottleVerdict",
    "TicketOps",
    "TicketRecord",
    "Tx",
]

Json: TypeAlias = Any
"""A JSON value as produced by ``json.loads`` (dict, list, str, int, float, bool, None)."""

class Seal(Protocol):
    """``seal(seq, prev_hash, entry, text) -> hash``: the audit module hashes, the store keeps
    the chain. ``text``: the entry as the store writes it (``sql.dump_json``) where that is its
    canonical form (``canonical.is_canonical``), else None."""

    def __call__(self, seq: int, prev_hash: str, entry: dict[str, Any],
                 text: str | None = None) -> str: ...



class CheckpointSigner(Protocol):
    """Signs a checkpoint of the head an append moves the chain to, in the append's own
    transaction, when one is due (``audit.checkpointer``). Asked under the head's lock, after
    the ``ChainGuard`` vouched for the head the append extends: what it signs is a record its
    worker is committing, chained onto a verified head, and it commits (or not) with it."""

    def due(self, seq: int) -> bool:
        """Whether record ``seq`` is due a checkpoint by this worker's count (nothing slow)."""
        ...

    def sign(self, seq: int, head_hash: str, covered: int) -> AuditCheckpoint | None:
        """The checkpoint of record ``seq`` (hash ``head_hash``), unless the newest stored
        checkpoint, of record ``covered`` (0: none), leaves none due."""
        ...

    def refused(self, checkpoint: AuditCheckpoint, error: StoreError) -> None:
        """The store refused to store ``checkpoint`` (rolled back alone: the records go on)."""
        ...


class ChainGuard(Protocol):
    """Vouches for the head a writer is about to extend (``audit.tip``: the last head this worker
    verified). The store asks it under the head's lock (or before its compare-and-swap)."""

    def since(self, head: tuple[int, str]) -> tuple[int, str] | None:
        """None when ``head`` (seq, hash) is the head already vouched for; else that known head:
        the store reads the records between the two (both ends included) for ``vouch``."""
        ...

    def reads_from(self) -> tuple[int, str] | None:
        """The start ``since`` gives for any head but the one it knows (None: not known yet):
        a store may read the records from there together with the head, for ``vouch``."""
        ...

    def vouch(self, start: tuple[int, str], head: tuple[int, str],
              records: Sequence[AuditRecord]) -> None:
        """``records``: the stored records from the lower seq of ``start`` and ``head`` to the
        higher, in order. Raises (a ``StoreError``) unless they link the two unchanged."""
        ...

    def broken(self, start: tuple[int, str], head: tuple[int, str],
               records: Sequence[AuditRecord]) -> tuple[int, str] | None:
        """``vouch``'s check alone, changing nothing and safe to ask from any thread (a store
        may run a whole append on its writer's thread): None when ``records`` link ``start``
        and ``head`` unchanged, else the first contradiction (seq, reason). The store then
        writes nothing and asks ``vouch``, which raises."""
        ...

    def vouched(self, start: tuple[int, str], head: tuple[int, str]) -> None:
        """After ``broken`` found nothing under the head's lock and the append committed: what
        ``vouch`` would have done then (on the caller's thread)."""
        ...


AUDIT_GENESIS_HASH = "sha256:" + "0" * 64
"""``prev_hash`` of the first audit record."""

MAX_PAGE = 500
"""The most items one list call returns, whatever ``limit`` it is given (a page that holds this
many may have more after it)."""

TaskState: TypeAlias = Literal["pending", "running", "succeeded", "failed"]
TASK_STATES: tuple[str, ...] = ("pending", "running", "succeeded", "failed")


# --------------------------------------------------------------------------------------- errors


class StoreError(Exception):
    """Base class of every error the store raises; driver errors never escape unwrapped."""


class StaleStart(StoreError):
    """``ChainGuard.vouch``: the start ``since`` gave no longer holds (a head verified inside a
    transaction that did not commit); the guard dropped it: ask ``since`` again."""


class NotFound(StoreError):
    """The addressed record does not exist."""

    def __init__(self, kind: str, id: str) -> None:
        super().__init__(f"{kind} not found")
        self.kind = kind
        self.id = id


class Conflict(StoreError):
    """A conditional write did not apply; ``reason`` is a stable machine code.

    Reasons: ``duplicate_id``, ``state_conflict``, ``not_pending``, ``duplicate_review``,
    ``expired``, ``ticket_consumed``, ``ticket_expired``, ``ticket_not_approved``,
    ``ticket_binding_mismatch`` (``fields`` names the mismatched bindings), ``session_revoked``,
    ``session_expired``, ``task_claimed`` (another executor claimed the task).
    """

    def __init__(
        self,
        reason: str,
        *,
        current_state: str | None = None,
        fields: tuple[str, ...] = (),
    ) -> None:
        detail = reason if current_state is None else f"{reason} (state {current_state})"
        if fields:
            detail += f" ({', '.join(fields)})"
        super().__init__(detail)
        self.reason = reason
        self.current_state = current_state
        self.fields = fields


class StoreUnavailable(StoreError):
    """The database cannot be reached or is locked past its timeout; callers fail closed (503).

    The message names the backend and the error class; opening a store, also where (the
    SQLite path, or the PostgreSQL host:port/database) and the driver's or server's message.
    Never the DSN's user info or password.
    """


class StoreOutcomeUnknown(StoreUnavailable):
    """A write transaction's COMMIT was sent but its answer never came (the connection died or
    the deadline passed while it was in flight): it may or may not have committed.

    Only a backend that talks to its database over a network raises it (PostgreSQL). A caller
    must not claim the write did not happen: ``committed()`` tells once the store answers again
    (True, False, or None while it cannot tell yet); it is None when the backend could not
    name the transaction (nothing to ask about).
    """

    def __init__(self, message: str,
                 committed: Callable[[], Awaitable[bool | None]] | None = None) -> None:
        super().__init__(message)
        self.committed = committed
        #: Where the write staged its audit record in the same transaction and the staging id
        #: was in the lost answer: finds it once ``committed()`` said True (None: sealed
        #: already, by a sweep).
        self.staged_of: Callable[[], Awaitable[int | None]] | None = None


# -------------------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class SessionRecord:
    id: str
    subject_id: str
    kind: str
    authn_method: str
    auth_time: float
    created_at: float
    expires_at: float
    step_up_at: float | None = None
    step_up_method: str | None = None
    revoked_at: float | None = None


@dataclass(frozen=True, slots=True)
class PublishedKey:
    """The public half of one replica's token signing key: ``public_key`` is the base64url raw
    Ed25519 key (a JWK's ``x``), ``kid`` its RFC 7638 thumbprint; ``verify_until`` is None while
    the key signs."""

    kid: str
    public_key: str
    created_at: float
    verify_until: float | None


@dataclass(frozen=True, slots=True)
class ReviewRecord:
    reviewer: str
    decision: Literal["approve", "reject"]
    group: str | None
    reason: str | None
    at: float


@dataclass(frozen=True, slots=True)
class TicketRecord:
    id: str
    subject_id: str
    env: str
    resource: Json
    resource_hash: str
    action: str
    command_hash: str | None
    # Only a hash of the nonce is ever stored: a database dump must not be enough to redeem.
    nonce_hash: str
    state: TicketState
    requested_by: str
    reason: str | None
    created_at: float
    pending_until: float
    approved_at: float | None
    expires_at: float | None
    consumed_at: float | None
    consumed_correlation_id: str | None
    closed_by: str | None
    approval: Json
    reviews: tuple[ReviewRecord, ...] = ()
    # When the ticket reached rejected / expired / revoked (consumed_at covers consumption).
    closed_at: float | None = None
    # The command text as the requester sent it (a string or an argv list; its hash is
    # command_hash), or None when the ticket binds no command or predates command text.
    command: Json | None = None


@dataclass(frozen=True, slots=True)
class TaskRecord:
    id: str
    state: TaskState
    progress: int
    result: Json | None
    created_by: str
    created_at: float
    updated_at: float
    last_seq: int
    #: The executor whose first report moved the task to running; only it reports afterwards.
    claimed_by: str | None = None


@dataclass(frozen=True, slots=True)
class TaskRead:
    """Task ``id`` as one read found it: ``task`` is None when there was no such task then."""

    id: str
    task: TaskRecord | None


@dataclass(frozen=True, slots=True)
class RunRead:
    """What a chain run that presents a ticket reads before it decides, as one statement found
    it (``TicketOps.get_run_read``): the caller's session, the ticket (with its reviews) and
    the task the run targets (None when the run targets none); None where there is no row."""

    session: SessionRecord | None
    ticket_id: str
    ticket: TicketRecord | None
    task: TaskRead | None


@dataclass(frozen=True, slots=True)
class EventRecord:
    task_id: str
    seq: int
    kind: str
    at: float
    actor: str
    data: Json


class CheckedEntry(dict[str, Any]):
    """An audit entry (already scrubbed) whose stored text its caller made and checked with the
    store's own rules, in the same walk as the scrub (``audit.record.prepare``): ``text`` is
    what ``sql.dump_json`` would return for it, ``canonical`` what ``canonical.is_canonical``
    would say of that text. The store takes both instead of walking the entry again."""

    __slots__ = ("canonical", "text")

    text: str
    canonical: bool


@dataclass(frozen=True)
class AuditRecord:
    seq: int
    prev_hash: str
    hash: str
    entry: dict[str, Any]
    #: The entry as stored (``sql.dump_json``), where the store has it: ``Seal`` hashes it
    #: without encoding the entry again. Not part of the record's identity.
    text: str | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, seq: int, prev_hash: str, hash: str, entry: dict[str, Any],
           text: str | None = None) -> AuditRecord:
        """``cls(seq, prev_hash, hash, entry, text)``, filled in directly: a frozen dataclass's
        ``__init__`` sets each field through ``object.__setattr__`` (0.87 -> 0.35 us a record;
        every record a group commit writes, and every one a worker verifies, is made here).
        The same fields in the same order (``tests/store/test_audit_record.py``)."""
        record = object.__new__(cls)
        fields = record.__dict__
        fields["seq"] = seq
        fields["prev_hash"] = prev_hash
        fields["hash"] = hash
        fields["entry"] = entry
        fields["text"] = text
        return record


@dataclass(frozen=True, slots=True)
class AuditCheckpoint:
    """A signed statement "record ``seq`` of the chain has hash ``head_hash``" (``audit.checkpoint``).

    ``at`` is the RFC 3339 text that was signed, kept verbatim (not a float: it is signed data);
    ``sig`` is the base64url Ed25519 signature by audit key ``kid``. The store only keeps them.
    """

    seq: int
    head_hash: str
    at: str
    kid: str
    sig: str


@dataclass(frozen=True, slots=True)
class PolicyRevisionRecord:
    """A published policy revision: immutable once stored (``authz.revisions`` owns the format).

    ``bundle`` is the bundle document (policy modules and data files), ``signature`` the
    flattened JWS over its digest by key ``kid``; ``author``/``message``/``created_at`` are what
    the publisher signed, ``published_by``/``published_at`` who stored it and when."""

    id: str
    digest: str
    bundle: dict[str, Any]
    signature: dict[str, Any]
    kid: str
    author: str
    message: str
    created_at: float
    published_by: str
    published_at: float


@dataclass(frozen=True, slots=True)
class PolicyActivation:
    """One change of the fleet's active revision (``kind``: ``activate`` or ``rollback``);
    ``previous_id`` is what was active before (``""``: none)."""

    seq: int
    revision_id: str
    previous_id: str
    kind: str
    activated_by: str
    activated_at: float
    reason: str | None = None
    #: The activation's JWS (``authz.activations``); None: written unsigned (refused by every
    #: store-following replica).
    signature: dict[str, str] | None = None


OutboxState: TypeAlias = Literal["pending", "delivered", "dead"]


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """A notification event, written in the same transaction as the ticket change it reports.

    ``id`` is a UUID that stays the same across retries (receivers de-duplicate on it); ``seq``
    orders the outbox; ``data`` is the event's payload (no nonce, no token). The rest is the
    dispatcher's bookkeeping: ``state``, ``attempts`` in the current window, when the next
    attempt is due, when the window of ``notifications.max_age_s`` began (creation, or the last
    ``retry``), the last error, and the sinks that already accepted it.
    """

    id: str
    type: str
    ticket_id: str
    env: str
    at: float
    data: Json
    seq: int = 0
    state: OutboxState = "pending"
    attempts: int = 0
    next_attempt_at: float = 0.0
    window_start: float = 0.0
    last_error: str | None = None
    finished_at: float | None = None
    delivered_sinks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """The latest attempt to deliver one event to one sink (``attempts`` counts them all)."""

    event_id: str
    sink: str
    state: Literal["delivered", "failed"]
    attempts: int
    last_status: int | None
    last_error: str | None
    at: float


# ------------------------------------------------------------------------------------ protocols


@dataclass(frozen=True, slots=True)
class ThrottleRule:
    """One failure budget an attempt must fit in (``SessionOps.reserve_attempt``).

    A key counts the failures of a window that opens at its first failure and lasts
    ``window_s``; the next failure after that opens a new window. With ``limit`` the key refuses
    attempts while it holds ``limit`` failures (a lockout until its window ends). From
    ``delay_after`` failures on, each failure also spaces the next attempt: ``delay_base_s``
    after the ``delay_after``-th, doubling per failure up to ``delay_max_s`` (a slowdown that
    never asks for more than ``delay_max_s``).
    """

    key: str
    window_s: float
    limit: int | None = None
    delay_after: int | None = None
    delay_base_s: float = 0.0
    delay_max_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ThrottleVerdict:
    """``granted``: one failure is now reserved on every rule's key (``failures``, this attempt
    included). Otherwise nothing changed; ``refused`` names the keys that said no, ``failures``
    holds their counts and ``retry_at`` is when all of them would let an attempt through."""

    granted: bool
    failures: dict[str, int]
    refused: tuple[str, ...] = ()
    retry_at: float = 0.0


class SessionOps(Protocol):
    """Sessions, one-time claims (JWT ``jti`` replay, TOTP code reuse) and login throttling."""

    async def create_session(self, rec: SessionRecord) -> None: ...
    async def get_session(self, id: str) -> SessionRecord | None: ...
    # ``get_session`` answered without waiting, as a 1-tuple; None where it must be awaited.
    def session_now(self, id: str) -> tuple[SessionRecord | None] | None: ...
    async def revoke_session(self, id: str, at: float) -> bool: ...
    # Revokes every live (unrevoked, unexpired at ``at``) session of a subject; returns how many.
    async def revoke_subject_sessions(self, subject_id: str, at: float) -> int: ...
    async def record_step_up(self, id: str, at: float, method: str) -> SessionRecord: ...
    async def claim_once(self, namespace: str, key: str, expires_at: float, now: float) -> bool: ...

    # Login throttling: an attempt reserves one failure on every rule's key before the secret is
    # verified, all keys or none, each with one conditional write (atomic across workers and
    # replicas); a success gives the reservation back (``release_failure``) or resets the key.
    async def reserve_attempt(
        self, rules: Sequence[ThrottleRule], now: float
    ) -> ThrottleVerdict: ...
    # Gives back the failure reserved at ``reserved_at`` (a no-op once a new window has opened).
    async def release_failure(self, key: str, reserved_at: float) -> None: ...
    async def clear_failures(self, key: str) -> None: ...
    # The failures a key holds at ``now`` (0 once its window has ended).
    async def count_failures(self, key: str, now: float, window_s: float) -> int: ...

    # Housekeeping: one-time claims past their expiry, throttle keys whose window opened before
    # ``failures_before``, sessions that expired before ``sessions_before``; returns the counts.
    async def purge_expired(
        self, now: float, failures_before: float, sessions_before: float
    ) -> tuple[int, int, int]: ...


@dataclass(frozen=True, slots=True)
class OidcLoginRecord:
    """A pending OpenID Connect authorization request (single use; keyed by its state's hash)."""

    state_hash: str
    provider: str
    purpose: str  # login | step_up
    nonce: str
    code_verifier: str
    browser_hash: str | None
    session_id: str | None  # the session a step-up is for
    redirect_uri: str
    cli_redirect: str | None
    cli_challenge: str | None
    created_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class HandoffRecord:
    """A one-time code a loopback CLI redeems (RFC 8252 + PKCE) for the session it started."""

    code_hash: str
    challenge: str
    session_id: str
    stepped_up: bool
    expires_at: float


@dataclass(frozen=True, slots=True)
class FederatedSession:
    """What the IdP said about a session's person; refreshed at every sign-in and step-up."""

    session_id: str
    provider: str
    foreign_sub: str
    groups: tuple[str, ...]
    updated_at: float


@dataclass(frozen=True, slots=True)
class FederatedSubject:
    subject_id: str
    kind: str
    source: str
    first_seen: float
    last_seen: float


class FederationOps(Protocol):
    """Identity federation: pending OIDC logins and CLI handoffs (each taken once, across
    workers and replicas), the IdP facts of federated sessions, federated subjects seen."""

    async def put_oidc_login(self, rec: OidcLoginRecord) -> None: ...
    async def take_oidc_login(self, state_hash: str, now: float) -> OidcLoginRecord | None: ...
    async def put_handoff(self, rec: HandoffRecord) -> None: ...
    async def take_handoff(self, code_hash: str, now: float) -> HandoffRecord | None: ...
    async def put_federated_session(self, rec: FederatedSession) -> None: ...
    async def get_federated_session(self, session_id: str) -> FederatedSession | None: ...
    async def record_federated_subject(
        self, subject_id: str, kind: str, source: str, at: float
    ) -> None: ...
    async def list_federated_subjects(self, limit: int = 100) -> list[FederatedSubject]: ...
    async def last_federated_session(self, subject_id: str) -> FederatedSession | None:
        """The IdP facts of ``subject_id``'s most recently updated session still kept."""
        ...
    async def purge_federation(self, now: float) -> int: ...


class TicketOps(Protocol):
    """Approval tickets; every state change is one conditional write (``approvals.states``),
    and writes its ``approval.*`` outbox event in the same transaction (``approvals.events``)."""

    async def create_ticket(self, rec: TicketRecord) -> None: ...
    async def get_ticket(self, id: str) -> TicketRecord | None: ...
    async def get_ticket_and_task(self, id: str, task_id: str
                                  ) -> tuple[TicketRecord | None, TaskRead | None]:
        """``get_ticket`` and, in the same statement (one snapshot), task ``task_id``: a chain
        run's pre-read, for a run whose target may be a task (``Store.run_transaction``). The
        task read is None when there is no such ticket."""
        ...
    async def get_run_read(self, session_id: str, ticket_id: str, task_id: str | None
                           ) -> RunRead:
        """Session ``session_id``, ticket ``ticket_id`` and task ``task_id`` in one statement:
        the reads of a chain run that presents a ticket, sent together where each read is a
        round trip (``Store.reads_round_trip``; ``middleware.authn.confirm``)."""
        ...
    async def list_tickets(
        self,
        state: str | None = None,
        env: str | None = None,
        subject_id: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> tuple[list[TicketRecord], str | None]: ...
    async def add_review(
        self,
        id: str,
        review: ReviewRecord,
        new_state: str | None,
        approved_expires_at: float | None,
        now: float,
    ) -> TicketRecord: ...
    async def transition_ticket(
        self, id: str, from_states: tuple[str, ...], to_state: str, at: float, by: str
    ) -> TicketRecord: ...
    async def consume_ticket(
        self,
        id: str,
        *,
        nonce_hash: str,
        subject_id: str,
        env: str,
        action: str,
        resource_hash: str,
        command_hash: str | None,
        now: float,
        correlation_id: str,
    ) -> TicketRecord: ...
    async def expire_tickets(self, now: float) -> list[TicketRecord]: ...


class TaskOps(Protocol):
    """Tasks and their gap-free step events."""

    async def ensure_task(self, id: str, created_by: str, at: float) -> TaskRecord: ...
    async def get_task(self, id: str) -> TaskRecord | None: ...
    async def list_tasks(self, state: str, limit: int = 100) -> list[TaskRecord]: ...
    async def append_event(
        self,
        task_id: str,
        kind: str,
        actor: str,
        data: Json,
        at: float,
        *,
        state: str | None = None,
        progress: int | None = None,
        result: Json | None = None,
        claimant: str | None = None,
    ) -> EventRecord: ...
    async def list_events(
        self, task_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[EventRecord]: ...


class AuditOps(Protocol):
    """The audit hash chain: the store links each record to the previous one atomically."""

    # ``guard``: asked before the head is extended (``ChainGuard``); what it raises rolls back.
    async def append_audit(self, entry: dict[str, Any], seal: Seal, *,
                           guard: ChainGuard | None = None) -> AuditRecord: ...
    # ``checkpoint``: asked once the records are linked, in the same transaction
    # (``CheckpointSigner``); a checkpoint it signs is stored with them. Appends that commit
    # on their own without a transaction (PostgreSQL's optimistic path) do not ask it.
    async def append_audit_many(
        self, entries: Sequence[dict[str, Any]], seal: Seal, *, guard: ChainGuard | None = None,
        checkpoint: CheckpointSigner | None = None,
    ) -> list[AuditRecord]: ...
    # ``decoded=False``: each record's stored text only (``entry`` left empty), as the tip checks
    # records (``audit.record.verify(stored_text=True)``): no JSON decoding of records it hashes.
    async def audit_range(self, after_seq: int = 0, limit: int = 100, *,
                          decoded: bool = True) -> list[AuditRecord]: ...
    async def audit_head(self) -> tuple[int, str]: ...

    # Staged records: ``stage_audit`` keeps an entry (in the caller's transaction, no global lock)
    # and returns its staging id; ``seal_audit`` moves the committed staged rows named by ``ids``
    # (or, without ids, up to ``limit`` staged before ``staged_before``) into the chain in one
    # transaction under the head's lock, in staging order, and returns (staging id, record) for
    # each it sealed: a row another sealer took first is not returned. ``audit_staged``: how
    # many rows staged before ``staged_before`` are still unsealed, and the oldest one's time.
    async def stage_audit(self, entry: dict[str, Any], at: float) -> int: ...
    async def seal_audit(
        self, seal: Seal, ids: Sequence[int] = (), *, staged_before: float | None = None,
        limit: int = MAX_PAGE, guard: ChainGuard | None = None,
    ) -> list[tuple[int, AuditRecord]]: ...
    async def audit_staged(self, staged_before: float) -> tuple[int, float | None]: ...

    # Signed checkpoints: at most one per seq. ``add`` returns False (and changes nothing) when
    # that seq already has one, so workers checkpointing the same record are harmless.
    async def add_audit_checkpoint(self, checkpoint: AuditCheckpoint) -> bool: ...
    async def audit_checkpoints(
        self, after_seq: int = 0, limit: int = 100
    ) -> list[AuditCheckpoint]: ...
    async def latest_audit_checkpoint(self) -> AuditCheckpoint | None: ...


class PolicyRevisionOps(Protocol):
    """Published policy revisions and the fleet's active one (every replica follows it)."""

    # Stores a revision; False (nothing changed) when that id is already stored with the same
    # digest; Conflict ``duplicate_id`` when it is stored with other content.
    async def add_policy_revision(self, rec: PolicyRevisionRecord) -> bool: ...
    async def get_policy_revision(self, id: str) -> PolicyRevisionRecord | None: ...
    # A proposed revision (signature verified, vetting passed, not yet approved): what a
    # policy.publish ticket's reviewers read. ``published_*`` hold who proposed it, when.
    async def add_policy_candidate(self, rec: PolicyRevisionRecord) -> None: ...
    async def get_policy_candidate(self, id: str) -> PolicyRevisionRecord | None: ...
    # Newest first; ``before``: a published_at cursor (the last item of the previous page).
    async def list_policy_revisions(
        self, limit: int = 50, before: float | None = None
    ) -> list[PolicyRevisionRecord]: ...
    # Makes ``revision_id`` the active revision (NotFound if it is not stored; ``""``: none, every
    # replica runs its policies directory again). ``expected``:
    # only if this is the active one now (``""``: none), else Conflict ``state_conflict``; one
    # conditional write, so concurrent activations from any replica apply one at a time. Its
    # seq is above every stored activation's and above ``after_seq`` (the last one the caller's
    # replica accepted). ``sign``: called with the activation (its seq known, inside the
    # transaction) for the signature stored with it.
    async def activate_policy_revision(
        self, revision_id: str, *, kind: str, by: str, at: float, reason: str | None = None,
        expected: str | None = None,
        sign: Callable[[PolicyActivation], dict[str, str]] | None = None, after_seq: int = 0,
    ) -> PolicyActivation: ...
    # The latest activation (what every replica must run), or None before the first.
    async def active_policy(self) -> PolicyActivation | None: ...
    async def policy_activations(self, limit: int = 50) -> list[PolicyActivation]: ...


class PublishedKeyOps(Protocol):
    """Token signing keys published by every replica (public halves only)."""

    # Insert or update each key (by kid), then delete every key whose window closed before
    # ``now``.
    async def publish_signing_keys(self, keys: Sequence[PublishedKey], now: float) -> None: ...
    # Every key that verifies at ``now``.
    async def published_signing_keys(self, now: float) -> list[PublishedKey]: ...


class OutboxOps(Protocol):
    """The notification outbox. Ticket changes write its events themselves (``TicketOps``: each
    change and its event commit together); the dispatcher claims due events under a lease
    (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, the writer lock on SQLite), so no two claimers
    hold one event at once, and events of one ticket are claimed in order."""

    # Whether any event is due at ``now`` (a read: idle dispatchers take no write lock).
    async def outbox_due(self, now: float) -> bool: ...
    # Up to ``limit`` due events, leased to ``owner`` until ``now + lease_s``; an event whose
    # ticket has an earlier pending event is not due until that one is finished.
    async def claim_outbox(
        self, owner: str, now: float, lease_s: float, limit: int
    ) -> list[OutboxEvent]: ...
    # Up to ``limit`` due events finished as delivered at once, without a lease or delivery
    # records: what a dispatcher with no sinks does (every sink that wants them, none, has
    # them); returns how many.
    async def settle_outbox(self, now: float, limit: int) -> int: ...
    # Record the attempts and the event's new state; False (the deliveries are still recorded)
    # when ``owner`` no longer holds the lease.
    async def finish_outbox(
        self,
        event_id: str,
        owner: str,
        deliveries: Sequence[DeliveryRecord],
        *,
        state: OutboxState,
        next_attempt_at: float,
        error: str | None,
        now: float,
    ) -> bool: ...
    async def get_outbox_event(self, event_id: str) -> OutboxEvent | None: ...
    # Newest first; ``failed``: dead events and pending ones whose last attempt failed.
    async def list_outbox(
        self, *, failed: bool = False, limit: int = 50, before_seq: int | None = None
    ) -> list[OutboxEvent]: ...
    async def outbox_deliveries(self, event_id: str) -> list[DeliveryRecord]: ...
    # A dead event becomes pending again, due at ``now`` with a fresh max-age window and no last
    # error; its per-sink history stays (NotFound for an unknown id, Conflict ``state_conflict``
    # unless dead).
    async def retry_outbox(self, event_id: str, now: float) -> OutboxEvent: ...
    # Delete delivered events finished before ``delivered_before``; returns how many.
    async def purge_outbox(self, delivered_before: float) -> int: ...


class Tx(SessionOps, TicketOps, TaskOps, FederationOps, AuditOps, OutboxOps, PolicyRevisionOps,
         PublishedKeyOps, Protocol):
    """Every operation, all inside one transaction: they commit together or not at all."""


class Store(SessionOps, TicketOps, TaskOps, FederationOps, AuditOps, OutboxOps, PolicyRevisionOps,
         PublishedKeyOps, Protocol):
    """A durable store: every operation is its own transaction; ``transaction()`` groups them."""

    #: Told of every transaction the store opens (``write``); the worker's metrics hook.
    on_transaction: Callable[[bool], None] | None
    #: Told, as each transaction ends, how many client/server round trips it made (statements,
    #: BEGIN, COMMIT or ROLLBACK); only stores with a server (PostgreSQL) call it.
    on_round_trips: Callable[[int], None] | None
    #: Told as each transaction ends whether the store served it: ``(write, served)``, served
    #: False when it raised ``StoreUnavailable``; the worker's readiness hook.
    on_outcome: Callable[[bool, bool], None] | None
    #: True where runs should stage their audit records (``stage_audit``) and leave chaining
    #: them to batched ``seal_audit`` calls: stores shared by several writing processes, where
    #: a lock held until each run's COMMIT would serialise them all.
    stages_audit: bool
    #: True where every read is a round trip to a server (PostgreSQL): there a chain run that
    #: presents a ticket reads its session with the ticket (``get_run_read``) instead of apart.
    reads_round_trip: bool

    async def ping(self) -> None: ...
    async def close(self) -> None: ...
    async def describe(self) -> dict[str, Any]: ...
    def transaction(self) -> AbstractAsyncContextManager[Tx]: ...
    def run_transaction(self, ticket: TicketRecord | None, task: TaskRead | None = None
                        ) -> AbstractAsyncContextManager[Tx]:
        """``transaction()`` for a chain run that redeems ``ticket`` (already read and checked),
        or none: the same guarantees; a backend may send the run's writes together. ``task``:
        a task as the ticket's pre-read found it (``get_ticket_and_task``), which a backend may
        take instead of reading it again (every write on it re-checks it)."""
        ...
