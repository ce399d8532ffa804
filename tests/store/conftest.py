"""Fixtures: ``store`` runs each test on both real backends (SQLite file, PostgreSQL schema);
``schema``, ``proxy`` and ``app_client``: an app on a PostgreSQL schema reached through the fault
proxy (tests/store/faultproxy.py), with a 2 s store deadline."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.store import Store, open_store

from . import pg
from .faultproxy import FaultProxy, proxied

#: The store deadline of ``app_client``.
DEADLINE_S = 2.0
#: By when a call bounded by ``DEADLINE_S`` has been answered: the deadline plus slack for a
#: loaded machine (scheduling, the answer's own record). The failures this separates from are a
#: stall never answered and the 5 s default deadline applied instead of the configured one.
ANSWERED_WITHIN_S = DEADLINE_S + 2.5


@dataclass(frozen=True)
class Target:
    """Where a test's store lives, so other processes can open the same one."""

    backend: str
    url: str
    schema: str | None = None


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    if request.param == "sqlite":
        yield Target("sqlite", f"sqlite:///{tmp_path / 'store.db'}")
        return
    async with pg.temp_schema() as (dsn, schema):
        yield Target("postgres", dsn, schema)


@pytest.fixture
async def store(target: Target) -> AsyncIterator[Store]:
    s = await open_store(target.url, schema=target.schema)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def schema() -> AsyncIterator[tuple[str, str]]:
    async with pg.temp_schema("cp_fault") as (dsn, name):
        yield dsn, name


@pytest.fixture
async def proxy(schema: tuple[str, str]) -> AsyncIterator[tuple[FaultProxy, str]]:
    async with proxied(schema[0]) as (p, dsn):
        yield p, dsn


@pytest.fixture
async def app_client(make_client: Any, schema: tuple[str, str],
                     proxy: tuple[FaultProxy, str]) -> TestClient:
    return await make_client({"store": {
        "backend": "postgres", "timeout_s": DEADLINE_S,
        "postgres": {"dsn": proxy[1], "schema": schema[1]},
    }})
