"""Identities reload without a restart: poll + SIGHUP, last good set on a broken file, and the
sessions of disabled or removed subjects revoked at reload."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from service import sighup
from service.authn import passwords
from service.authn.errors import InvalidCredentials, InvalidToken
from service.authn.identities import IdentityDirectory
from service.authn.keyring import KeyRing
from service.authn.reload import IdentityFile, reload_once, reloading
from service.authn.sessions import Authenticator
from service.config import AuthnConfig
from service.store import Store
from tests.servers import REPO, serve

from .conftest import CHEAP, NOW, PASSWORDS, identities_document


def write(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(document), encoding="utf-8")
    os.replace(tmp, path)  # as cpctl identities does: readers see one file or the other


def with_erin() -> dict[str, Any]:
    document = identities_document()
    document["identities"].append({"subject_id": "erin", "kind": "human",
                                   "password_hash": passwords.hash_password("erin-pw", CHEAP)})
    return document


@pytest.fixture(autouse=True)
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("service.clock.now", lambda: NOW + 10)  # the sessions' clock


@pytest.fixture
def source(tmp_path: Path) -> IdentityFile:
    path = tmp_path / "identities.yaml"
    write(path, identities_document())
    return IdentityFile(path)


@pytest.fixture
def live(
    store: Store, source: IdentityFile, keyring: KeyRing, settings: AuthnConfig
) -> Authenticator:
    return Authenticator(store, source.load(), keyring, settings)


async def test_an_added_user_can_log_in_after_reload(
    live: Authenticator, source: IdentityFile
) -> None:
    with pytest.raises(InvalidCredentials):
        await live.login_password("erin", "erin-pw", "10.0.0.1", NOW)
    assert not source.changed()
    write(source.path, with_erin())
    assert source.changed()
    assert await reload_once(live, source) is True
    assert not source.changed()
    issued = await live.login_password("erin", "erin-pw", "10.0.0.1", NOW)
    assert (await live.authenticate_bearer(issued.access_token, NOW)).subject_id == "erin"


async def test_a_broken_file_keeps_the_last_good_set_and_reports_degraded(
    live: Authenticator, source: IdentityFile, caplog: pytest.LogCaptureFixture
) -> None:
    before = live.identities
    assert "status" not in live.status(NOW)
    source.path.write_text("identities: [{subject_id: x}]\n", encoding="utf-8")
    with caplog.at_level(logging.ERROR, logger="controlplane.authn"):
        assert await reload_once(live, source) is False
        assert await reload_once(live, source) is False  # same error: logged once
    assert len([r for r in caplog.records if "reload failed" in r.getMessage()]) == 1
    assert live.identities is before
    status = live.status(NOW)
    assert status["status"] == "degraded" and "identities.schema.json" in status["detail"]
    assert "password" not in status["detail"]
    await live.login_password("alice", PASSWORDS["alice"], "10.0.0.1", NOW)  # still served
    write(source.path, with_erin())
    assert await reload_once(live, source) is True
    assert "status" not in live.status(NOW)
    assert live.identities.get("erin") is not None


async def test_disabled_and_removed_users_lose_their_sessions(
    live: Authenticator, source: IdentityFile, store: Store
) -> None:
    alice = await live.login_password("alice", PASSWORDS["alice"], "10.0.0.1", NOW)
    bob = await live.login_password("bob", PASSWORDS["bob"], "10.0.0.1", NOW)
    document = identities_document()
    entries = document["identities"]
    next(e for e in entries if e["subject_id"] == "alice")["disabled"] = True
    document["identities"] = [e for e in entries if e["subject_id"] != "bob"]
    write(source.path, document)
    assert await reload_once(live, source) is True
    for issued in (alice, bob):
        session = await store.get_session(issued.session_id)
        assert session is not None and session.revoked_at is not None
        with pytest.raises(InvalidToken):
            await live.authenticate_bearer(issued.access_token, NOW)
    assert not live.revocations_pending


async def test_a_revocation_the_store_refused_is_retried(
    live: Authenticator,
    source: IdentityFile,
    store: Store,
    directory: IdentityDirectory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    alice = await live.login_password("alice", PASSWORDS["alice"], "10.0.0.1", NOW)
    document = identities_document()
    document["identities"] = [e for e in document["identities"] if e["subject_id"] != "alice"]
    write(source.path, document)
    broken = Authenticator(_Down(), live.identities, live.keys, live.settings)
    assert await reload_once(broken, source) is True  # swapped in; revocation pending
    assert broken.revocations_pending and broken.identities.get("alice") is None
    async with reloading(broken, source, interval_s=0.01):
        await asyncio.sleep(0.1)  # about ten failed retries
    failed = [r for r in caplog.records if "revoking the sessions" in r.getMessage()]
    assert len(failed) == 1 and broken.revocations_pending  # logged once, still queued
    broken._store = lambda: store  # the store is back
    async with reloading(broken, source, interval_s=0.02):
        for _ in range(100):
            if not broken.revocations_pending:
                break
            await asyncio.sleep(0.02)
    session = await store.get_session(alice.session_id)
    assert session is not None and session.revoked_at is not None


class _Down:
    async def revoke_subject_sessions(self, subject_id: str, at: float) -> int:
        from service.store.base import StoreUnavailable

        raise StoreUnavailable("down")


async def test_polling_and_sighup_both_reload(live: Authenticator, source: IdentityFile) -> None:
    async with reloading(live, source, interval_s=0.02):
        write(source.path, with_erin())
        for _ in range(100):
            if live.identities.get("erin") is not None:
                break
            await asyncio.sleep(0.02)
        assert live.identities.get("erin") is not None
    async with reloading(live, source, interval_s=0):  # polling off: only SIGHUP
        write(source.path, identities_document())
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(100):
            if live.identities.get("erin") is None:
                break
            await asyncio.sleep(0.02)
        assert live.identities.get("erin") is None


async def test_one_sighup_reaches_every_registered_reloader() -> None:
    calls: list[str] = []
    with sighup.on_sighup(lambda: calls.append("policies")):
        with sighup.on_sighup(lambda: calls.append("identities")):
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.sleep(0.05)
        assert calls == ["policies", "identities"]
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.sleep(0.05)
    assert calls == ["policies", "identities", "policies"]


async def test_a_broken_file_degrades_authn_in_system_info(
    make_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("service.authn.reload.POLL_INTERVAL_S", 0.02)
    path = tmp_path / "identities.yaml"
    path.write_text((REPO / "examples" / "identities.yaml").read_text(encoding="utf-8"),
                    encoding="utf-8")
    client = await make_client({"authn": {"identities": str(path)}})

    async def authn() -> dict[str, Any]:
        info = await (await client.get("/api/v1/system/info")).json()
        return dict(info["components"]["authn"])

    assert (await authn())["status"] == "ready"
    path.write_text("identities: nope\n", encoding="utf-8")
    for _ in range(100):
        if (status := await authn())["status"] == "degraded":
            break
        await asyncio.sleep(0.02)
    assert status["status"] == "degraded" and "last good set" in status["detail"]
    assert status["identities"]["human"] > 0  # the last good set still serves


async def test_cpctl_add_user_lets_them_log_in_to_a_running_server_within_5s(
    tmp_path: Path,
) -> None:
    path = tmp_path / "identities.yaml"
    path.write_text((REPO / "examples" / "identities.yaml").read_text(encoding="utf-8"),
                    encoding="utf-8")
    env = {"CONTROLPLANE_AUTHN__IDENTITIES": str(path)}
    with serve(tmp_path / "state", env=env) as (base, _proc):
        login = base + "/api/v1/authn/sessions"
        body = {"subject_id": "erin", "password": "erin-password"}
        async with aiohttp.ClientSession() as http:
            async with http.post(login, json=body) as r:
                assert r.status == 401
            added = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "service", "identities", "add-user", "erin",
                 "--file", str(path), "--scrypt-ln", "4"],
                input=b"erin-password\n", cwd=REPO, capture_output=True, timeout=30, check=False)
            assert added.returncode == 0, added.stderr
            deadline = time.monotonic() + 5.0
            status = 0
            while time.monotonic() < deadline:  # a failure every 0.5 s: under the budget
                async with http.post(login, json=body) as r:
                    status = r.status
                if status in (200, 201):
                    break
                await asyncio.sleep(0.5)
            assert status in (200, 201)
