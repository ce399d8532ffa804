"""Opening a store: URL forms, unreachable databases (fail closed) and bad arguments."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.store import StoreUnavailable, open_store, sqlite_path


@pytest.mark.parametrize(
    ("url", "path"),
    [
        pytest.param("sqlite:///var/lib/cp/store.db", "/var/lib/cp/store.db", id="absolute"),
        pytest.param("sqlite:state/store.db", "state/store.db", id="relative"),
    ],
)
def test_sqlite_path(url: str, path: str) -> None:
    assert sqlite_path(url) == path


@pytest.mark.parametrize(
    "url",
    ["sqlite://host/store.db", "sqlite::memory:", "sqlite:", "sqlite:///x.db?mode=ro"],
)
async def test_bad_sqlite_urls(url: str) -> None:
    with pytest.raises(ValueError):
        await open_store(url)


async def test_unknown_scheme() -> None:
    with pytest.raises(ValueError):
        await open_store("mysql://localhost/x")


async def test_schema_only_for_postgres(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        await open_store(f"sqlite:///{tmp_path}/x.db", schema="s")


async def test_sqlite_relative_url_and_file_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = await open_store("sqlite:state/store.db")
    try:
        await store.ping()
    finally:
        await store.close()
    db = tmp_path / "state" / "store.db"
    assert db.exists()
    assert db.stat().st_mode & 0o077 == 0  # owner-only: sessions and ticket bindings live here


async def test_sqlite_unopenable_path_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailable) as exc:
        await open_store(f"sqlite:///{blocker}/store.db")
    assert f"{blocker}/store.db" in str(exc.value)  # opening names the path (no secret)


async def test_sqlite_not_a_database_is_unavailable(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(StoreUnavailable):
        await open_store(f"sqlite:///{junk}")


async def test_postgres_bad_dsn_is_unavailable() -> None:
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    with pytest.raises(StoreUnavailable) as exc:
        await open_store("postgresql://postgres:s3cret@127.0.0.1:1/test")
    # Where (host:port/database) but never the user info or the password.
    assert "s3cret" not in str(exc.value) and "postgres:" not in str(exc.value)
    assert "127.0.0.1:1/test" in str(exc.value)


async def test_postgres_invalid_schema_name() -> None:
    with pytest.raises(ValueError):
        await open_store("postgresql://postgres@127.0.0.1:1/test", schema='x"; DROP TABLE y; --')
