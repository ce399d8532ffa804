"""Issue 13 (4, 5, 9) end to end: ``cpctl serve --workers 2``, 50 parallel wrong passwords and 50
parallel wrong OTP codes from one address. At most the configured budget (``max_failures``, 5) is
evaluated, counted from the servers' own structured log events, and the real user logging in from
another loopback address still gets in."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from service.authn import totp
from tests.auth import PASSWORDS, TOTP_SECRETS
from tests.servers import serve

ATTEMPTS = 50
BUDGET = 5  # authn.max_failures by default


def log_events(path: Path) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and str(doc.get("event", "")).startswith("authn."):
            assert "password" not in doc and "otp" not in doc
            counts[(doc["event"], str(doc.get("reason")))] += 1
    return counts


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
               token: str | None = None) -> tuple[int, dict[str, Any], str | None]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.post(url, json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None), r.headers.get("Retry-After")


def from_address(addr: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64, local_addr=(addr, 0)))


async def attack_and_log_in(base: str) -> dict[str, Any]:
    login = base + "/api/v1/authn/sessions"
    step_up = base + "/api/v1/authn/step-up"
    out: dict[str, Any] = {}
    async with from_address("127.0.0.1") as attacker:
        results = await asyncio.gather(*(
            post(attacker, login, {"subject_id": "alice", "password": f"guess-{i}"})
            for i in range(ATTEMPTS)))
        out["passwords"] = Counter((s, b.get("code")) for s, b, _ in results)
        out["retry_after"] = {r for s, _, r in results if s == 429}
    async with from_address("127.0.0.2") as user:
        status, body, _ = await post(user, login, {"subject_id": "alice",
                                                   "password": PASSWORDS["alice"]})
        out["user_login"] = status
        token = body.get("access_token")
        step = int(time.time() // 30)
        right = {totp.code_at(TOTP_SECRETS["alice"], (step + d) * 30) for d in (-1, 0, 1)}
        wrong = [f"{i:06d}" for i in range(0, 1_000_000, 7919) if f"{i:06d}" not in right]
        results = await asyncio.gather(*(
            post(user, step_up, {"otp": code}, token) for code in wrong[:ATTEMPTS]))
        out["codes"] = Counter((s, b.get("code")) for s, b, _ in results)
    async with from_address("127.0.0.3") as again:
        status, _, _ = await post(again, login, {"subject_id": "alice",
                                                 "password": PASSWORDS["alice"]})
        out["user_login_after_otp_attack"] = status
    return out


async def test_fifty_parallel_guesses_against_two_workers_evaluate_at_most_the_budget(tmp_path):
    state = tmp_path / "state"
    with serve(state, workers=2) as (base, proc):
        out = await attack_and_log_in(base)
        # each event is written before its response is sent
        events = log_events(proc.log_path)
    assert out["passwords"] == Counter({(401, "invalid_credentials"): BUDGET,
                                        (429, "login_throttled"): ATTEMPTS - BUDGET}), out
    assert out["retry_after"] and all(0 < int(r) <= 300 for r in out["retry_after"])
    assert out["user_login"] == 201
    assert out["codes"][(429, "login_throttled")] == ATTEMPTS - BUDGET, out
    assert sum(out["codes"].values()) == ATTEMPTS
    assert out["user_login_after_otp_attack"] == 201
    assert events[("authn.login_failed", "bad_password")] == BUDGET, events
    assert events[("authn.throttled", "source_locked")] == ATTEMPTS - BUDGET, events
    assert events[("authn.otp_failed", "otp_wrong")] == BUDGET, events
    assert events[("authn.throttled", "otp_locked")] == ATTEMPTS - BUDGET, events
