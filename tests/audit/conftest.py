"""Fixtures: a store on each real backend (SQLite file, PostgreSQL schema) that ``cpctl audit``
finds through the environment, as it would find a service's store, plus a state dir for keys."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.store import Store, open_store
from tests.store import pg


@dataclass(frozen=True)
class Target:
    backend: str
    url: str
    state_dir: Path
    schema: str | None = None


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def target(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Target]:
    for name in ("CONTROLPLANE_CONFIG", "CONTROLPLANE_TOKEN", "CONTROLPLANE_URL"):
        monkeypatch.delenv(name, raising=False)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("CONTROLPLANE_STATE_DIR", str(state))
    if request.param == "sqlite":
        yield Target("sqlite", f"sqlite:///{state / 'controlplane.db'}", state)
        return
    async with pg.temp_schema() as (dsn, schema):
        monkeypatch.setenv("CONTROLPLANE_STORE__BACKEND", "postgres")
        monkeypatch.setenv("CONTROLPLANE_STORE__POSTGRES__DSN", dsn)
        monkeypatch.setenv("CONTROLPLANE_STORE__POSTGRES__SCHEMA", schema)
        yield Target("postgres", dsn, state, schema)


@pytest.fixture
async def store(target: Target) -> AsyncIterator[Store]:
    s = await open_store(target.url, schema=target.schema)
    try:
        yield s
    finally:
        await s.close()
