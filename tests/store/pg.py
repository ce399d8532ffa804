"""PostgreSQL for tests: the DSN, a reachability check, and throwaway schemas.

Importable by other test packages as ``tests.store.pg``. The server is
``postgresql://postgres@127.0.0.1:5432/test`` unless ``CONTROLPLANE_TEST_PG_DSN`` says otherwise.
When it is unreachable the tests skip with the reason, except under ``CI=true``, where a missing
database must fail the run instead of silently testing one backend.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

__all__ = ["DEFAULT_DSN", "drop_schema", "dsn", "redacted", "require_postgres", "temp_schema"]

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"

# Probed once per test process: an unreachable server would otherwise cost a timeout per test.
_probe: dict[str, str | None] = {}


def dsn() -> str:
    return os.environ.get("CONTROLPLANE_TEST_PG_DSN") or DEFAULT_DSN


def redacted(value: str) -> str:
    """The DSN without its password, for messages."""
    parts = urlsplit(value)
    if parts.password is None:
        return value
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


async def _unreachable_reason(target: str) -> str | None:
    try:
        conn = await asyncpg.connect(target, timeout=3)
    except Exception as exc:  # any failure to connect is a reason to skip (or fail in CI)
        return f"{type(exc).__name__}: {exc}"
    try:
        await conn.fetchval("SELECT 1")
    finally:
        await conn.close()
    return None


async def require_postgres() -> str:
    """The DSN of a reachable server; skips (or fails under ``CI=true``) otherwise."""
    target = dsn()
    if target not in _probe:
        _probe[target] = await _unreachable_reason(target)
    reason = _probe[target]
    if reason is not None:
        message = f"PostgreSQL not reachable at {redacted(target)}: {reason}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return target


def unique_schema(prefix: str = "cp_test") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


async def drop_schema(target: str, schema: str) -> None:
    """Drop ``schema``. A service still running on it (its background loops read and write
    until its test client closes) can make PostgreSQL pick the DROP as a deadlock victim; the
    DROP is then simply tried again."""
    conn = await asyncpg.connect(target, timeout=5)
    try:
        for attempt in range(5):
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                return
            except asyncpg.exceptions.DeadlockDetectedError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.1 * (attempt + 1))
    finally:
        await conn.close()


@asynccontextmanager
async def temp_schema(prefix: str = "cp_test") -> AsyncIterator[tuple[str, str]]:
    """Yield ``(dsn, schema)`` for a fresh schema name, dropped afterwards."""
    target = await require_postgres()
    schema = unique_schema(prefix)
    try:
        yield target, schema
    finally:
        await drop_schema(target, schema)
