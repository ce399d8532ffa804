"""``cpctl login | step-up | logout | whoami`` against a real ``cpctl serve`` process."""

from __future__ import annotations

import io
import json
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.cli import session
from service.cli.client import CredentialStore, credentials_path, server_url
from tests.auth import KEYS, PASSWORDS, otp
from tests.servers import REPO, free_port, serve


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    with serve(tmp_path_factory.mktemp("session-cli") / "state") as (base, proc):
        yield base, proc


@dataclass
class Cli:
    base: str
    scope: object  # the server process: TOTP steps are single-use per server
    creds: Path
    monkeypatch: pytest.MonkeyPatch

    def login(self, subject: str, *extra: str) -> int:
        if subject in KEYS:
            return session.run(["login", subject, "--key", str(KEYS[subject]), *extra])
        self.monkeypatch.setattr(sys, "stdin", io.StringIO(PASSWORDS[subject] + "\n"))
        return session.run(["login", subject, "--password-stdin", *extra])

    def token(self) -> str | None:
        entry = CredentialStore(self.creds).get(self.base)
        return None if entry is None else entry["access_token"]


@pytest.fixture
def cli(server: tuple[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    base, proc = server
    creds = tmp_path / "config" / "controlplane" / "credentials.json"
    monkeypatch.setenv("CONTROLPLANE_CREDENTIALS", str(creds))
    monkeypatch.setenv("CONTROLPLANE_URL", base)
    monkeypatch.delenv("CONTROLPLANE_TOKEN", raising=False)
    return Cli(base, proc, creds, monkeypatch)


def whoami_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    capsys.readouterr()
    assert session.run(["whoami", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_login_whoami_logout(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.login("alice") == 0
    out = capsys.readouterr()
    token = cli.token()
    assert token and token not in out.out + out.err  # never printed without --print-token
    assert "logged in" in out.out and "alice" in out.out

    assert session.run(["whoami"]) == 0
    assert "alice (human)" in capsys.readouterr().out
    principal = whoami_json(capsys)
    assert principal["subject_id"] == "alice" and principal["kind"] == "human"
    assert principal["step_up"]["verified"] is False

    assert session.run(["logout"]) == 0
    assert cli.token() is None
    assert session.run(["whoami"]) == 1
    assert "not logged in" in capsys.readouterr().err
    # The old token is dead on the server, not only forgotten here.
    assert session.run(["whoami", "--token", token]) == 1
    err = capsys.readouterr().err
    assert " 401 " in f" {err}" and "session_" in err and "Traceback" not in err


def test_credentials_file_is_private(cli: Cli) -> None:
    assert cli.login("alice") == 0
    assert stat.S_IMODE(cli.creds.stat().st_mode) == 0o600
    assert stat.S_IMODE(cli.creds.parent.stat().st_mode) == 0o700
    doc = json.loads(cli.creds.read_text())
    entry = doc["servers"][cli.base]
    assert entry["subject_id"] == "alice" and entry["session_id"] and entry["expires_at"]
    # Atomic replace leaves no temporary files behind.
    assert [p.name for p in cli.creds.parent.iterdir()] == ["credentials.json"]


def test_print_token_prints_only_the_token(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.login("bob", "--print-token") == 0
    out = capsys.readouterr()
    assert out.out.strip() == cli.token()
    assert out.out.count("\n") == 1 and "logged in" in out.err
    assert whoami_json(capsys, "--token", out.out.strip())["subject_id"] == "bob"


def test_step_up_replaces_the_stored_token(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.login("carol") == 0
    before = cli.token()
    assert session.run(["step-up", "--otp", "000000"]) == 1
    err = capsys.readouterr().err
    assert "otp_invalid" in err and "Traceback" not in err

    assert session.run(["step-up", "--otp", otp("carol", cli.scope)]) == 0
    assert "stepped up" in capsys.readouterr().out
    assert cli.token() != before
    assert whoami_json(capsys)["step_up"]["verified"] is True


def test_step_up_prompts_when_no_code_is_given(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.login("alice") == 0
    cli.monkeypatch.setattr(sys, "stdin", io.StringIO(otp("alice", cli.scope) + "\n"))
    assert session.run(["step-up"]) == 0
    assert whoami_json(capsys)["step_up"]["verified"] is True


def test_service_logs_in_with_a_key(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.login("ci-bot") == 0
    principal = whoami_json(capsys)
    assert principal["subject_id"] == "ci-bot" and principal["kind"] == "service"


def test_key_that_is_not_a_private_key(cli: Cli, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bogus = tmp_path / "k.pem"
    bogus.write_text("not a key\n")
    assert session.run(["login", "ci-bot", "--key", str(bogus)]) == 1
    assert "not an unencrypted PEM private key" in capsys.readouterr().err


def test_wrong_password_is_one_line_without_traceback(cli: Cli) -> None:
    # A real process, so what the user sees on stderr is exactly what is asserted.
    result = subprocess.run(
        [sys.executable, "-c",
         "import sys; from service.cli.session import run; raise SystemExit(run(sys.argv[1:]))",
         "login", "alice", "--password-stdin"],
        input="not-the-password\n", capture_output=True, text=True, cwd=REPO, timeout=60,
        env={"PATH": "/usr/bin:/bin", "CONTROLPLANE_URL": cli.base,
             "CONTROLPLANE_CREDENTIALS": str(cli.creds)},
    )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("cpctl login: error: 401 invalid_credentials:")
    assert "correlation_id" in lines[0]
    assert not cli.creds.exists()


def test_token_from_environment_overrides_the_store(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.login("alice") == 0
    cli.monkeypatch.setenv("CONTROLPLANE_TOKEN", "not-a-token")
    assert session.run(["whoami"]) == 1
    assert " 401 " in capsys.readouterr().err
    cli.monkeypatch.delenv("CONTROLPLANE_TOKEN")
    assert session.run(["whoami"]) == 0


def test_password_prompt_needs_a_terminal(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    cli.monkeypatch.setattr(sys, "stdin", io.StringIO("alice-dev-password\n"))
    assert session.run(["login", "alice"]) == 1
    assert "--password-stdin" in capsys.readouterr().err


def test_unreachable_server_exits_2(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert session.run(["whoami", "--server", url, "--token", "x"]) == 2
    err = capsys.readouterr().err
    assert "connection refused" in err and len(err.splitlines()) == 1


def test_logout_of_a_dead_session_still_forgets_the_token(
    cli: Cli, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.login("alice") == 0
    token = cli.token()
    assert session.run(["logout", "--token", token]) == 0  # ends the session, file untouched
    assert cli.token() == token
    assert session.run(["logout"]) == 0
    assert cli.token() is None
    assert "already ended" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({"CONTROLPLANE_CREDENTIALS": "/x/c.json", "XDG_CONFIG_HOME": "/y"}, "/x/c.json",
                     id="explicit path wins"),
        pytest.param({"XDG_CONFIG_HOME": "/y"}, "/y/controlplane/credentials.json", id="xdg"),
        pytest.param({"XDG_CONFIG_HOME": "relative"}, "~/.config/controlplane/credentials.json",
                     id="relative xdg ignored"),
        pytest.param({}, "~/.config/controlplane/credentials.json", id="default"),
    ],
)
def test_credentials_path(environ: dict[str, str], expected: str) -> None:
    assert credentials_path(environ) == Path(expected).expanduser()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param(None, "http://127.0.0.1:8700", id="default"),
        pytest.param("http://LOCALHOST:9/", "http://localhost:9", id="normalised"),
        pytest.param("https://cp.example/api/", "https://cp.example/api", id="prefix"),
    ],
)
def test_server_url(given: str | None, expected: str) -> None:
    assert server_url(given, {}) == expected


def test_server_url_from_environment_and_bad_urls() -> None:
    from service.cli.client import UsageError

    assert server_url(None, {"CONTROLPLANE_URL": "http://h:1"}) == "http://h:1"
    for bad in ("ftp://h", "h:8700", "http://u:p@h", "http://h/?q=1"):
        with pytest.raises(UsageError):
            server_url(bad, {})


def test_credentials_are_kept_per_server(tmp_path: Path) -> None:
    store = CredentialStore(tmp_path / "d" / "credentials.json")
    store.put("http://a:1", {"access_token": "A"})
    store.put("http://b:2", {"access_token": "B"})
    assert store.forget("http://a:1") is True and store.forget("http://a:1") is False
    assert store.get("http://a:1") is None and store.get("http://b:2") == {"access_token": "B"}
