"""``cpctl audit verify | checkpoint | tail | keys``: the chain of a real service's store, then the
same store tampered with.

The service writes records and signs checkpoints of them; the test edits the stored rows directly
(``sqlite3`` / ``asyncpg``), as someone with database access would, and ``cpctl audit verify`` must
name the first broken record. Rewrites that recompute the chain: tests/audit/test_tamper.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from service.authn import passwords
from service.cli import audit, session
from service.cli.client import Client
from tests.auth import PASSWORDS
from tests.servers import REPO, serve
from tests.store import pg

ERIN_PASSWORD = "erin-test-password"  # an admin in policies/data/bindings.yaml; no dev identity


def activity(base: str, subject: str = "alice", reads: int = 3) -> None:
    """Log in and read the ticket list a few times: each read is one audit record."""
    answer = Client(base).post("/api/v1/authn/sessions",
                               {"subject_id": subject, "password": PASSWORDS[subject]}, auth=False)
    api = Client(base, answer["access_token"])
    for _ in range(reads):
        api.get("/api/v1/approvals")


def verify(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = audit.run(["verify", "--json", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ("CONTROLPLANE_CONFIG", "CONTROLPLANE_TOKEN", "CONTROLPLANE_URL", "CONTROLPLANE_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONTROLPLANE_CREDENTIALS", str(tmp_path / "credentials.json"))
    return monkeypatch


@pytest.fixture
def sqlite_service(tmp_path: Path, env: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A running service on SQLite with some records; the CLI reads the same state dir."""
    state = tmp_path / "state"
    with serve(state) as (base, _proc):
        activity(base)
        env.setenv("CONTROLPLANE_STATE_DIR", str(state))
        yield base, state / "controlplane.db"


def seqs(db: Path) -> list[int]:
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT seq FROM audit_log ORDER BY seq")]


def test_verify_while_running_then_after_a_clean_stop(
    tmp_path: Path, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    env.setenv("CONTROLPLANE_STATE_DIR", str(state))
    with serve(state) as (_, _proc):
        activity(_)
        n = len(seqs(state / "controlplane.db"))
        assert n >= 3
        # Fewer than audit.checkpoint_records records, within the interval: not signed yet.
        code, result = verify(capsys)
        assert code == 3 and result["status"] == "unanchored" and result["problems"] == []
        assert result["unverifiable"] == {"first": 1, "last": n} and result["verified_head"] is None
    # A clean stop signs the head: the whole chain verifies.
    assert audit.run(["verify"]) == 0
    head = json.loads(sqlite3.connect(state / "controlplane.db").execute(
        "SELECT json_object('seq', seq, 'hash', hash) FROM audit_head").fetchone()[0])
    assert capsys.readouterr().out.strip() == (
        f"audit chain ok: {n} records verified (head seq {n}); "
        f"signed head: seq {n} {head['hash']} (1 checkpoints)")
    code, result = verify(capsys)
    assert code == 0 and result == {
        "ok": True, "status": "ok", "verified": n, "head_seq": n, "break": None, "problems": [],
        "verified_head": head, "unverifiable": None, "checkpoints": 1, "anchors": 0,
            "mirrored": 0}


def test_checkpoints_every_n_records_mirrored_and_anchored(
    tmp_path: Path, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """audit.checkpoint_records=2: the running service signs as it goes, mirrors each checkpoint
    to the JSON-lines file, and an anchor taken from it verifies; a rotated key keeps verifying."""
    state, mirror = tmp_path / "state", tmp_path / "audit.jsonl"
    env.setenv("CONTROLPLANE_STATE_DIR", str(state))
    settings = {"CONTROLPLANE_AUDIT__CHECKPOINT_RECORDS": "2",
                "CONTROLPLANE_AUDIT__JSONL_PATH": str(mirror)}
    with serve(state, env=settings) as (base, _):
        activity(base, reads=5)
        db = state / "controlplane.db"
        for _ in range(200):  # written in the background after the commits
            with sqlite3.connect(db) as conn:
                if conn.execute("SELECT count(*) FROM audit_checkpoints").fetchone()[0] >= 2:
                    break
            threading.Event().wait(0.05)
        assert (state / "audit-keys").stat().st_mode & 0o777 == 0o700
        key_files = list((state / "audit-keys").glob("*.audit-key.json"))
        assert len(key_files) == 1 and key_files[0].stat().st_mode & 0o777 == 0o600
        assert not list((state / "keys").glob("*.audit-key.json"))  # not a token key
        capsys.readouterr()
        assert audit.run(["keys", "rotate"]) == 0
        rotated = json.loads(capsys.readouterr().out)
        activity(base, reads=4)
    lines = [json.loads(line) for line in mirror.read_text().splitlines()]
    checkpoints = [line for line in lines if line.get("purpose") == "controlplane-audit-checkpoint"]
    assert len(checkpoints) >= 3
    assert {c["kid"] for c in checkpoints} == {k["kid"] for k in rotated["keys"]}
    assert "private_key" not in json.dumps(rotated) and "d" not in rotated["keys"][0]
    # The mirror itself, shipped off the host, is an anchor file; so is `audit checkpoint --out`.
    anchor = tmp_path / "anchor.json"
    assert audit.run(["checkpoint", "--out", str(anchor)]) == 0
    assert json.loads(anchor.read_text())["seq"] == len(seqs(db))
    code, result = verify(capsys, "--anchor", str(mirror), "--anchor", str(anchor))
    assert code == 0 and result["anchors"] == len(checkpoints) + 1
    assert result["checkpoints"] >= len(checkpoints)
    # The public keys, kept elsewhere, verify without the state dir's key files.
    capsys.readouterr()
    assert audit.run(["keys", "list"]) == 0
    jwks = tmp_path / "audit-keys.json"
    jwks.write_text(capsys.readouterr().out)
    assert len(json.loads(jwks.read_text())["keys"]) == 2
    env.setenv("CONTROLPLANE_AUDIT__KEYS_DIR", str(tmp_path / "elsewhere"))
    assert audit.run(["verify"]) == 2  # no key ring there: cannot check the signatures
    assert "no audit key directory" in capsys.readouterr().err
    code, result = verify(capsys, "--keys", str(jwks))
    assert code == 0 and result["ok"]


def _edit_entry(conn: sqlite3.Connection, seq: int) -> None:
    (text,) = conn.execute("SELECT entry FROM audit_log WHERE seq = ?", (seq,)).fetchone()
    entry = json.loads(text)
    entry["status"] = 204 if entry.get("status") != 204 else 200
    conn.execute("UPDATE audit_log SET entry = ? WHERE seq = ?", (json.dumps(entry), seq))


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        pytest.param(_edit_entry, "hash_mismatch", id="entry edited"),
        pytest.param(lambda c, s: c.execute("DELETE FROM audit_log WHERE seq = ?", (s,)), "seq_gap",
                     id="row deleted"),
        pytest.param(lambda c, s: c.execute("UPDATE audit_log SET prev_hash = ? WHERE seq = ?",
                                            ("sha256:" + "1" * 64, s)), "prev_hash_mismatch",
                     id="link rewritten"),
    ],
)
def test_verify_names_the_tampered_sqlite_row(
    sqlite_service: tuple[str, Path], capsys: pytest.CaptureFixture[str], tamper: Any, reason: str
) -> None:
    _, db = sqlite_service
    target = seqs(db)[1]
    with sqlite3.connect(db) as conn:
        tamper(conn, target)
    assert audit.run(["verify"]) == 1
    out = capsys.readouterr().out
    assert f"record {target}: {reason}" in out
    code, result = verify(capsys)
    assert code == 1 and result["break"] == {"seq": target, "reason": reason}
    assert result["verified"] == target - 1


def test_verify_notices_a_truncated_chain(
    sqlite_service: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, db = sqlite_service
    last = seqs(db)[-1]
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM audit_log WHERE seq = ?", (last,))
    code, result = verify(capsys)
    assert code == 1 and result["break"] == {"seq": last, "reason": "missing"}


def test_verify_with_a_config_file(
    tmp_path: Path, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    with serve(state) as (base, _):
        activity(base, reads=1)
    config = tmp_path / "service.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(state)}))
    code, result = verify(capsys, "--config", str(config))
    assert code == 0 and result["ok"] and result["verified"] >= 1


def test_verify_without_a_store(
    tmp_path: Path, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("CONTROLPLANE_STATE_DIR", str(tmp_path / "nothing-here"))
    assert audit.run(["verify"]) == 2
    assert "no store at" in capsys.readouterr().err
    assert not (tmp_path / "nothing-here").exists()  # verify never creates a store
    bad = tmp_path / "bad.yaml"
    bad.write_text("store: {backend: nope}\n")
    assert audit.run(["verify", "--config", str(bad)]) == 2
    assert "/store/backend" in capsys.readouterr().err


def test_tail_last_n_from_the_store(
    sqlite_service: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, db = sqlite_service
    all_seqs = seqs(db)
    capsys.readouterr()
    assert audit.run(["tail", "-n", "2"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["seq"] for r in lines] == all_seqs[-2:]
    assert lines[1]["prev_hash"] == lines[0]["hash"]
    assert {"action", "outcome", "correlation_id"} <= lines[1].keys()


def test_tail_follow_prints_new_records(sqlite_service: tuple[str, Path]) -> None:
    base, db = sqlite_service
    head = seqs(db)[-1]
    # Ctrl-C as a terminal sends it: the follower starts with SIGINT's default action, whatever
    # this process inherited (a job a non-interactive shell starts with '&' ignores SIGINT,
    # and so would every child it starts, which then cannot be stopped by Ctrl-C at all).
    follower = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "from service.cli.audit import run; raise SystemExit(run(sys.argv[1:]))",
         "tail", "-n", "1", "-f", "--interval", "0.1", "--max-seconds", "60"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={"PATH": "/usr/bin:/bin", "CONTROLPLANE_STATE_DIR": str(db.parent)},
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in follower.stdout or ()],
                              daemon=True)
    reader.start()
    try:
        # Readiness: the head record (-n 1) is printed once the follower has read the head, so
        # the records written next are new to it.
        seen = [json.loads(lines.get(timeout=30))["seq"]]
        activity(base, reads=2)
        while len(seen) < 3:
            seen.append(json.loads(lines.get(timeout=30))["seq"])
        follower.send_signal(signal.SIGINT)  # Ctrl-C is how -f ends: exit 0
        _, err = follower.communicate(timeout=30)
        reader.join(timeout=30)
        while not lines.empty():
            seen.append(json.loads(lines.get())["seq"])
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        reader.join(timeout=30)  # at the end of its output once the follower has ended
        for pipe in (follower.stdout, follower.stderr):
            if pipe is not None:
                pipe.close()  # else a failure here leaks them into the next test's warnings
    assert follower.returncode == 0, err
    assert seen[0] == head, "the follower's first line is the head record"
    new = seen[1:]
    assert new[0] == head + 1 and new == list(range(head + 1, head + 1 + len(new)))
    assert len(new) >= 2


def _identities_with_admin(path: Path) -> Path:
    doc = yaml.safe_load((REPO / "examples/identities.yaml").read_text())
    doc["identities"].append({
        "subject_id": "erin", "kind": "human",
        "password_hash": passwords.hash_password(ERIN_PASSWORD, passwords.ScryptParams(ln=4)),
    })
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_tail_over_http_needs_audit_read(tmp_path: Path, env: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    identities = _identities_with_admin(tmp_path / "identities.yaml")
    with serve(tmp_path / "state", env={"CONTROLPLANE_AUTHN__IDENTITIES": str(identities)}) as (base, _):
        activity(base)
        env.setenv("CONTROLPLANE_URL", base)
        env.setattr(sys, "stdin", io.StringIO("alice-dev-password\n"))
        assert session.run(["login", "alice", "--password-stdin"]) == 0
        capsys.readouterr()
        assert audit.run(["tail", "--server", base]) == 1
        assert "403 denied" in capsys.readouterr().err

        env.setattr(sys, "stdin", io.StringIO(ERIN_PASSWORD + "\n"))
        assert session.run(["login", "erin", "--password-stdin"]) == 0
        capsys.readouterr()
        assert audit.run(["tail", "-n", "3", "--server", base]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 3
    assert [r["seq"] for r in lines] == list(range(lines[0]["seq"], lines[0]["seq"] + 3))
    assert lines[1]["prev_hash"] == lines[0]["hash"] and lines[2]["prev_hash"] == lines[1]["hash"]


# -- PostgreSQL --------------------------------------------------------------------------------


async def _pg_tamper(dsn: str, schema: str) -> int:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        # The schema name is ours (pg.unique_schema); identifiers cannot be bound parameters.
        rows = await conn.fetch(f'SELECT seq, entry FROM "{schema}".audit_log ORDER BY seq')  # noqa: S608
        seq, text = rows[1]["seq"], rows[1]["entry"]
        entry = json.loads(text)
        entry["outcome"] = "tampered"
        await conn.execute(f'UPDATE "{schema}".audit_log SET entry = $1 WHERE seq = $2',  # noqa: S608
                           json.dumps(entry), seq)
        return int(seq)
    finally:
        await conn.close()


@pytest.mark.postgres
def test_verify_names_the_tampered_postgres_row(tmp_path: Path, env: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    dsn = asyncio.run(pg.require_postgres())  # skips, or fails under CI=true, as pg.py decides
    schema = pg.unique_schema("cp_cli_audit")
    store_env = {
        "CONTROLPLANE_STORE__BACKEND": "postgres",
        "CONTROLPLANE_STORE__POSTGRES__DSN": dsn,
        "CONTROLPLANE_STORE__POSTGRES__SCHEMA": schema,
    }
    try:
        with serve(tmp_path / "state", env=store_env) as (base, _):
            activity(base)
            for name, value in store_env.items():
                env.setenv(name, value)
        env.setenv("CONTROLPLANE_STATE_DIR", str(tmp_path / "state"))  # the audit keys
        code, result = verify(capsys)
        assert code == 0 and result["ok"] and result["verified"] >= 3
        assert result["verified_head"]["seq"] == result["head_seq"]
        tampered = asyncio.run(_pg_tamper(dsn, schema))
        assert audit.run(["verify"]) == 1
        assert f"record {tampered}: hash_mismatch" in capsys.readouterr().out
        # The same store named by a config file instead of the environment.
        for name in store_env:
            env.delenv(name)
        config = tmp_path / "pg.yaml"
        config.write_text(yaml.safe_dump(
            {"store": {"backend": "postgres", "postgres": {"dsn": dsn, "schema": schema}}}
        ))
        code, result = verify(capsys, "--config", str(config))
        assert code == 1 and result["break"] == {"seq": tampered, "reason": "hash_mismatch"}
    finally:
        asyncio.run(pg.drop_schema(dsn, schema))


def test_the_cpctl_entry_point_runs_the_audit_verbs(tmp_path: Path) -> None:
    """`cpctl audit checkpoint|verify|keys` as an operator runs them: the real process, its exit
    codes and output, against a state dir a stopped service left behind."""
    state = tmp_path / "state"
    with serve(state, env={"CONTROLPLANE_AUDIT__CHECKPOINT_RECORDS": "2"}) as (base, _):
        activity(base, reads=3)
    environ = {"PATH": "/usr/bin:/bin", "CONTROLPLANE_STATE_DIR": str(state)}

    def cpctl(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "service", "audit", *argv], cwd=REPO,
                              env=environ, capture_output=True, text=True, timeout=60, check=False)

    anchor = tmp_path / "anchor.json"
    taken = cpctl("checkpoint", "--out", str(anchor))
    assert taken.returncode == 0, taken.stderr
    verified = cpctl("verify", "--json", "--anchor", str(anchor))
    assert verified.returncode == 0, verified.stderr
    result = json.loads(verified.stdout)
    assert result["ok"] and result["anchors"] == 1
    assert result["verified_head"]["seq"] == json.loads(anchor.read_text())["seq"] == len(
        seqs(state / "controlplane.db"))
    listed = cpctl("keys", "list")
    assert listed.returncode == 0, listed.stderr
    assert [k["kty"] for k in json.loads(listed.stdout)["keys"]] == ["OKP"]
    assert "Traceback" not in taken.stderr + verified.stderr + listed.stderr
