"""``cpctl policy keygen | publish | activate | rollback | revisions`` against a real server that
follows the store (``policies.source: store``)."""

from __future__ import annotations

import io
import json
import shutil
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from service.cli import revisions, session
from tests.auth import PASSWORDS
from tests.servers import serve

REPO = Path(__file__).resolve().parents[2]


def _status(base: str) -> dict:
    with urllib.request.urlopen(base + "/api/v1/authz/status", timeout=5) as r:  # noqa: S310
        return dict(json.loads(r.read()))


def test_publish_activate_list_and_roll_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "keys" / "signer.pem"
    key.parent.mkdir()
    assert revisions.run(["keygen", str(key)]) == 0
    assert "kid:" in capsys.readouterr().out
    assert revisions.run(["keygen", str(key)]) == 1  # never overwrites a key
    activation = tmp_path / "keys" / "activation.pem"  # the replicas' activation key
    assert revisions.run(["keygen", str(activation)]) == 0
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "environments": {"dev": {"production": False}},
        "policies": {"source": "store", "store": {
            "trusted_keys": [str(key.with_name("signer.pub.pem"))],
            "activation_key": str(activation),
            "poll_interval_s": 0.2, "convergence_s": 5}}}))
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    with serve(tmp_path / "state", env={"CONTROLPLANE_CONFIG": str(config)}) as (base, _):
        monkeypatch.setenv("CONTROLPLANE_URL", base)
        monkeypatch.setenv("CONTROLPLANE_CREDENTIALS", str(tmp_path / "credentials.json"))
        monkeypatch.delenv("CONTROLPLANE_TOKEN", raising=False)
        monkeypatch.setattr(sys, "stdin", io.StringIO(PASSWORDS["alice"] + "\n"))
        assert session.run(["login", "alice", "--password-stdin"]) == 0

        published = []
        for note in ("first", "second"):
            with (policies / "authz.rego").open("a") as f:
                f.write(f"\n# {note}\n")
            capsys.readouterr()
            assert revisions.run(["publish", str(policies), "--key", str(key), "-m", note,
                                  "--json"]) == 0
            out = capsys.readouterr()
            assert "decision cases pass" in out.err
            published.append(json.loads(out.out)["id"])
        one, two = published

        for rev in (one, two):
            assert revisions.run(["activate", rev, "--reason", "roll out"]) == 0
        assert f"active: {two} (seq 2, activate; was {one})" in capsys.readouterr().out
        assert revisions.run(["rollback", "--reason", "back", "--json"]) == 0
        back = json.loads(capsys.readouterr().out)
        assert (back["revision"], back["kind"], back["previous"]) == (one, "rollback", two)
        assert revisions.run(["revisions"]) == 0
        table = capsys.readouterr().out
        assert f"active: {one} (seq 3, rollback by alice" in table
        assert f"* {one}" in table and f"  {two}" in table and "second" in table

        deadline = time.monotonic() + 5
        while _status(base)["revision"] != one:
            assert time.monotonic() < deadline, _status(base)
            time.sleep(0.1)

        # Signed by a key the server does not trust: refused, one line, exit 1.
        stranger = tmp_path / "stranger.pem"
        assert revisions.run(["keygen", str(stranger)]) == 0
        capsys.readouterr()
        assert revisions.run(["publish", str(policies), "--key", str(stranger),
                              "--no-cases"]) == 1
        err = capsys.readouterr().err
        assert "422 policy_signature_invalid" in err and "Traceback" not in err

