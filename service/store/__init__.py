"""Durable storage: ``open_store(url)`` returns the SQLite or PostgreSQL ``Store``.

URLs: ``sqlite:///ABS/PATH.db``, ``sqlite:relative/path.db`` or ``postgresql://...`` (also
``postgres://``). The scheme picks the backend; there is no plugin registry, so a type checker
sees both backends against the ``Store`` protocol. Migrations are applied at open.
"""

from __future__ import annotations

from .base import (
    AUDIT_GENESIS_HASH,
    AuditRecord,
    Conflict,
    EventRecord,
    NotFound,
    ReviewRecord,
    Seal,
    SessionRecord,
    Store,
    StoreError,
    StoreUnavailable,
    TaskRecord,
    TicketRecord,
    Tx,
)

__all__ = [
    "AUDIT_GENESIS_HASH",
    "AuditRecord",
    "Conflict",
    "EventRecord",
    "NotFound",
    "ReviewRecord",
    "Seal",
    "SessionRecord",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TaskRecord",
    "TicketRecord",
    "Tx",
    "open_store",
    "sqlite_path",
]


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:`` URL (``sqlite:///abs.db`` or ``sqlite:rel.db``)."""
    if not url.startswith("sqlite:"):
        raise ValueError("not a sqlite: URL")
    rest = url[len("sqlite:") :]
    if rest.startswith("//"):
        rest = rest[2:]
        # 'sqlite://host/x' would silently become a relative path; an in-memory database is
        # not durable and not shared between connections.
        if not rest.startswith("/"):
            raise ValueError("sqlite URL must be sqlite:///absolute/path or sqlite:relative/path")
    if not rest or rest.startswith(":memory:") or "?" in rest:
        raise ValueError("sqlite URL needs a plain file path")
    return rest


async def open_store(url: str, *, schema: str | None = None, timeout_s: float = 5.0) -> Store:
    """Open the store for ``url`` and apply pending migrations.

    ``schema`` (PostgreSQL only) sets the ``search_path`` and is created if missing; tests use it
    to isolate themselves. ``timeout_s`` is the deadline of every store call (``store.timeout_s``).
    Raises ``StoreUnavailable`` when the database cannot be reached,
    ``ValueError`` for an unsupported URL.
    """
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        if schema is not None:
            raise ValueError("schema applies to postgresql only")
        from .sqlite import SqliteStore

        return await SqliteStore.open(sqlite_path(url), busy_timeout_s=timeout_s)
    if scheme in ("postgresql", "postgres"):
        # Imported here so the embedded (SQLite) mode never loads the PostgreSQL driver.
        from .postgres import PostgresStore

        return await PostgresStore.open(url, schema=schema, timeout_s=timeout_s)
    raise ValueError(f"unsupported store URL scheme {scheme!r}")
