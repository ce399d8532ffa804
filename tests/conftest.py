"""Shared fixtures: a configuration per test (its own state dir) and the real app behind a client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.app import create_app
from service.config import Config, load
from tests import contract_hooks

REPO = Path(__file__).resolve().parent.parent

MakeConfig = Callable[..., Config]
MakeClient = Callable[..., Awaitable[TestClient]]


@pytest.fixture
def make_config(tmp_path: Path) -> MakeConfig:
    """Build a Config from defaults + ``overrides`` (nested dicts), state under ``tmp_path``."""

    def make(overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> Config:
        merged: dict[str, Any] = {"state_dir": str(tmp_path / "state")}
        merged.update(overrides or {})
        return load(None, environ or {}, base_dir=REPO, overrides=merged)

    return make


@pytest.fixture
def aiohttp_client(aiohttp_client: Any) -> Any:
    """pytest-aiohttp's client factory; every response of the real app is checked against
    schemas/openapi.yaml (status, content type, headers, body schema): tests/contract_hooks.py."""

    async def make(*args: Any, **kwargs: Any) -> Any:
        return contract_hooks.watch(await aiohttp_client(*args, **kwargs))

    return make


@pytest.fixture
def make_client(aiohttp_client: Any, make_config: MakeConfig) -> MakeClient:
    """Start the real application for ``overrides`` and return a client bound to it."""

    async def make(overrides: dict[str, Any] | None = None) -> TestClient:
        return await aiohttp_client(create_app(make_config(overrides)))

    return make


@pytest.fixture
async def client(make_client: MakeClient) -> TestClient:
    return await make_client()
