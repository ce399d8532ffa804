"""cpctl keys rotate/list, against a live server: old tokens keep working, new ones use the new key."""

from __future__ import annotations

import base64
import json
import urllib.request

from service.cli.main import main
from tests.auth import PASSWORDS
from tests.servers import serve


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),  # noqa: S310
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 (loopback)
        return json.loads(response.read())


def _whoami(base: str, token: str) -> int:
    request = urllib.request.Request(base + "/api/v1/authn/sessions/current",  # noqa: S310
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 (loopback)
        return response.status


def _kid(token: str) -> str:
    return json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))["kid"]


def test_rotation_under_a_running_server(tmp_path, capsys, monkeypatch):
    state = tmp_path / "state"
    monkeypatch.setenv("CONTROLPLANE_STATE_DIR", str(state))
    with serve(state) as (base, _):
        login = base + "/api/v1/authn/sessions"
        old = _post(login, {"subject_id": "carol", "password": PASSWORDS["carol"]})["access_token"]
        assert main(["keys", "rotate"]) == 0
        rotated = json.loads(capsys.readouterr().out)
        assert rotated["active_kid"] != _kid(old)
        assert set(rotated["verifying"]) == {rotated["active_kid"], _kid(old)}
        new = _post(login, {"subject_id": "carol", "password": PASSWORDS["carol"]})["access_token"]
        assert _kid(new) == rotated["active_kid"]
        assert _whoami(base, old) == 200 and _whoami(base, new) == 200
        assert main(["keys", "list"]) == 0
        assert json.loads(capsys.readouterr().out)["active_kid"] == rotated["active_kid"]


def _tree(root):
    return {p: p.stat().st_mtime_ns for p in root.rglob("*")} if root.exists() else None


def test_list_is_read_only_and_shows_creation_dates(tmp_path, capsys, monkeypatch):
    state = tmp_path / "state"
    monkeypatch.setenv("CONTROLPLANE_STATE_DIR", str(state))
    assert main(["keys", "rotate"]) == 0  # the first key, then a rotation: two keys
    capsys.readouterr()
    before = _tree(state)
    assert main(["keys", "list"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert _tree(state) == before  # no file created, touched or pruned
    keys = listed["keys"]
    assert len(keys) == 2 and keys[0]["active"] and not keys[1]["active"]
    assert listed["active_kid"] == keys[0]["kid"] and listed["verifying"] == [k["kid"] for k in keys]
    assert all(k["created_at"].endswith("Z") for k in keys)
    assert keys[0]["created_at"] >= keys[1]["created_at"]
    assert keys[0]["verify_until"] is None and keys[1]["verify_until"].endswith("Z")


def test_list_fails_cleanly_on_a_missing_state_dir(tmp_path, capsys, monkeypatch):
    state = tmp_path / "nothing-here"
    monkeypatch.setenv("CONTROLPLANE_STATE_DIR", str(state))
    assert main(["keys", "list"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "no key directory at" in captured.err
    assert str(state) in captured.err and "Traceback" not in captured.err
    assert not state.exists()  # a list creates nothing


def test_a_bad_environment_override_names_the_variable(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CONTROLPLANE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CONTROLPLANE_PORT", "eighty")
    assert main(["keys", "list"]) == 2
    assert "CONTROLPLANE_PORT: must be an integer" in capsys.readouterr().err
