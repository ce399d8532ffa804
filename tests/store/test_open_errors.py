"""Opening a store fails with what failed: host:port/database or the path, and the server's or
driver's message; never the user or the password. An unreachable store is retried with
exponential backoff."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from service import storelink
from service.config import load
from service.store import open_store
from service.store.base import StoreError, StoreUnavailable
from service.store.postgres import _opening_error, describe_dsn

from . import pg

SECRET = "s3cret-Pa55word"


async def failure(url: str, **kw: Any) -> StoreError:
    with pytest.raises(StoreError) as err:
        store = await open_store(url, timeout_s=3, **kw)
        await store.close()
    return err.value


async def test_sqlite_names_the_path_and_the_reason(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    err = await failure(f"sqlite:///{blocker / 'store.db'}")
    assert isinstance(err, StoreUnavailable)
    assert "a-file/store.db" in str(err) and "File exists" in str(err)


async def test_sqlite_names_the_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.write_text("not a database " * 100)
    err = await failure(f"sqlite:///{path}")
    assert str(path) in str(err) and "file is not a database" in str(err)


async def test_postgres_names_host_port_and_database_never_the_password() -> None:
    err = await failure(f"postgresql://cp-user:{SECRET}@127.0.0.1:1/cpdb")
    assert isinstance(err, StoreUnavailable)
    assert "127.0.0.1:1/cpdb" in str(err) and "refused" in str(err).lower()
    assert SECRET not in str(err) and "cp-user" not in str(err)


@pytest.mark.postgres
async def test_postgres_passes_the_servers_message_on() -> None:
    parts = urlsplit(await pg.require_postgres())
    # A password the server may not even ask for (trust): it must not show either way.
    netloc = f"{parts.username or 'postgres'}:{SECRET}@{parts.hostname}:{parts.port or 5432}"
    err = await failure(urlunsplit(parts._replace(netloc=netloc, path="/cp_no_such_database")))
    assert f"{parts.hostname}:{parts.port or 5432}/cp_no_such_database" in str(err)
    assert "does not exist" in str(err) and SECRET not in str(err)


def test_a_driver_message_that_echoes_the_dsn_is_scrubbed() -> None:
    dsn = f"postgresql://cp:{SECRET}@db.internal:6543/cp"

    class Echo(OSError):
        pass

    err = _opening_error(Echo(f"cannot connect to {dsn} as cp:{SECRET}"), dsn)
    assert isinstance(err, StoreUnavailable)
    assert SECRET not in str(err) and "db.internal:6543/cp" in str(err)
    assert describe_dsn("postgresql://u:p@[::1]:5433/x") == "[::1]:5433/x"
    assert describe_dsn("postgresql:///x?host=/run/postgresql") == "/run/postgresql:5432/x"


async def test_retries_back_off_exponentially_up_to_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load(None, {"CONTROLPLANE_STORE__BACKEND": "postgres",
                         "CONTROLPLANE_STORE__POSTGRES__DSN": "postgresql://x@127.0.0.1:1/x"},
                  base_dir=tmp_path)
    link = storelink.StoreLink(config)
    waits: list[float] = []
    attempts = iter([False] * 6 + [True])
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        waits.append(delay)
        await real_sleep(0)

    async def connect() -> bool:
        return next(attempts)

    monkeypatch.setattr(storelink.asyncio, "sleep", sleep)
    monkeypatch.setattr(link, "connect", connect)
    monkeypatch.setattr(storelink, "CONNECT_RETRY_S", 1.0)
    monkeypatch.setattr(storelink, "CONNECT_RETRY_MAX_S", 10.0)
    await link.retry()
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
