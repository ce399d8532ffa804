"""One store deadline per request: every store wait of a request comes out of it.

Each store call has its own deadline (``store.timeout_s``) from when it starts. A request makes
several calls in turn (the session check, its reads and writes, its audit record, and when the
store failed, the record of that failure), so without a bound of its own it could wait several
deadlines for a store that stalls in the middle of it. After ``begin(total_s)`` a request may
wait on the store ``total_s`` in all: each call ends at its own deadline or when the budget is
spent, whichever comes first (``call_deadline``), and the time it took is charged to the
budget (``charged``). Work that is not a store wait (policy evaluation, vetting a revision)
costs nothing. The store and the audit log read it; nothing HTTP lives here.

Tasks that outlive the call that started them (the audit log's group commit, its sealer, the
checkpointer) serve many requests and start in ``detached()`` context; a live stream, whose
polls go on for minutes, gives each poll its own deadline (``unbounded``).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Budget", "Waiting", "begin", "budget", "call_deadline", "charged", "detached",
           "end", "unbounded"]


class Budget:
    """What remains of one request's store deadline (seconds); shared by the tasks it starts."""

    __slots__ = ("left_s",)

    def __init__(self, left_s: float) -> None:
        self.left_s = left_s


_BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "controlplane_store_budget", default=None)


def begin(total_s: float) -> contextvars.Token[Budget | None]:
    """Let the store calls from now on (in this task and the tasks it starts) wait ``total_s``
    in all, until ``end`` with what this returned (a ``finally``: it wraps every request, where
    a context manager's calls cost more than the rest of this)."""
    return _BUDGET.set(Budget(total_s))


def end(token: contextvars.Token[Budget | None]) -> None:
    """The budget ``begin`` gave ``token`` for is over."""
    _BUDGET.reset(token)


@contextmanager
def budget(total_s: float) -> Iterator[None]:
    """``begin`` and ``end`` around a block."""
    token = begin(total_s)
    try:
        yield
    finally:
        end(token)


@contextmanager
def unbounded() -> Iterator[None]:
    """Store calls of this block each have their own deadline only (a live stream's polls)."""
    token = _BUDGET.set(None)
    try:
        yield
    finally:
        _BUDGET.reset(token)


def call_deadline(timeout_s: float) -> float:
    """The loop time by which a store call starting now must end: ``timeout_s`` from now, or
    sooner when less of the request's budget is left."""
    return Waiting(timeout_s).at


def charged() -> Waiting:
    """Charge the time this block takes (a store call, a wait for a group commit) to the
    request's budget, however the block ends."""
    return Waiting(None)


class Waiting:
    """A store wait that starts now, the one body of ``call_deadline`` and ``charged``, for a
    caller that needs both too (one read of the budget and of the loop's clock; the audit
    log's group commit waits on every read). ``at``: the loop time by which it must end,
    ``timeout_s`` from now or sooner as the budget says (``inf`` without a ``timeout_s``); as
    a context manager (a class, not a generator: it wraps every store call), the time from now
    to the block's end is charged to the request's budget, however the block ends."""

    __slots__ = ("_budget", "_started", "at")

    def __init__(self, timeout_s: float | None) -> None:
        self._budget = left = _BUDGET.get()
        self._started = now = asyncio.get_running_loop().time()
        self.at = math.inf if timeout_s is None else now + (
            timeout_s if left is None else max(0.0, min(timeout_s, left.left_s)))

    def __enter__(self) -> Waiting:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._budget is not None:
            self._budget.left_s -= asyncio.get_running_loop().time() - self._started


def detached() -> contextvars.Context:
    """A copy of the current context without a request's budget, for a task that serves many."""
    context = contextvars.copy_context()
    context.run(_BUDGET.set, None)
    return context
