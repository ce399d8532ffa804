"""Fixtures: ``store`` runs each test on both real backends (SQLite file, PostgreSQL schema)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.store import Store, open_store

from . import pg


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
