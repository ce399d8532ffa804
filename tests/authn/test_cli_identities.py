"""``cpctl identities``: hash-password, add-user and add-key edit a file the service can load."""

from __future__ import annotations

import io
import stat
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.authn import identities, passwords, totp
from service.cli.identities import run

from .conftest import public_pem

CHEAP = ["--scrypt-ln", "4"]


@pytest.fixture
def stdin(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    fake = io.StringIO()
    monkeypatch.setattr(sys, "stdin", fake)
    return fake


def test_hash_password_reads_stdin(stdin: io.StringIO, capsys: pytest.CaptureFixture[str]) -> None:
    stdin.write("hunter2-but-longer\n")
    stdin.seek(0)
    assert run(["hash-password", *CHEAP]) == 0
    encoded = capsys.readouterr().out.strip()
    assert passwords.verify_password("hunter2-but-longer", encoded)


def test_hash_password_refuses_empty(stdin: io.StringIO) -> None:
    assert run(["hash-password", *CHEAP]) == 1


def test_add_user_writes_a_loadable_file(
    tmp_path: Path, stdin: io.StringIO, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ids.yaml"
    path.write_text("# my header\nidentities: []\n", encoding="utf-8")
    stdin.write("erin-password\n")
    stdin.seek(0)
    assert run(["add-user", "erin", "--file", str(path), "--display-name", "Erin", *CHEAP]) == 0
    uri = urlparse(capsys.readouterr().out.strip())
    assert uri.scheme == "otpauth" and uri.netloc == "totp"
    secret = parse_qs(uri.query)["secret"][0]
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# my header\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    erin = identities.load(path).get("erin")
    assert erin is not None and erin.kind == "human" and erin.display_name == "Erin"
    assert erin.password_hash and passwords.verify_password("erin-password", erin.password_hash)
    assert erin.totp_secret == secret
    assert totp.verify(secret, totp.code_at(secret, 1000.0), 1000.0) is not None


def test_add_user_refuses_a_duplicate(tmp_path: Path, stdin: io.StringIO) -> None:
    path = tmp_path / "ids.yaml"
    stdin.write("pw-one\npw-two\n")
    stdin.seek(0)
    assert run(["add-user", "erin", "--file", str(path), *CHEAP]) == 0
    before = path.read_text(encoding="utf-8")
    assert run(["add-user", "erin", "--file", str(path), *CHEAP]) == 1
    assert path.read_text(encoding="utf-8") == before


def test_add_key_generates_a_private_key(tmp_path: Path) -> None:
    path, private = tmp_path / "ids.yaml", tmp_path / "bot.pem"
    assert (
        run(
            [
                "add-key",
                "deploy-bot",
                "--kind",
                "service",
                "--file",
                str(path),
                "--generate",
                str(private),
            ]
        )
        == 0
    )
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = serialization.load_pem_private_key(private.read_bytes(), None)
    assert isinstance(key, Ed25519PrivateKey)
    directory = identities.load(path)
    loaded = directory.public_key_for("deploy-bot")
    assert loaded is not None
    assert loaded.public_bytes_raw() == key.public_key().public_bytes_raw()
    # Never overwrite an existing private key.
    assert (
        run(
            ["add-key", "other", "--kind", "agent", "--file", str(path), "--generate", str(private)]
        )
        == 1
    )


def test_add_key_from_a_public_pem(tmp_path: Path) -> None:
    path, pem = tmp_path / "ids.yaml", tmp_path / "agent.pub"
    key = Ed25519PrivateKey.generate()
    pem.write_text(public_pem(key), encoding="ascii")
    assert (
        run(
            ["add-key", "agent-9", "--kind", "agent", "--file", str(path), "--public-key", str(pem)]
        )
        == 0
    )
    identity = identities.load(path).get("agent-9")
    assert identity is not None and identity.kind == "agent"
    bad = tmp_path / "bad.pub"
    bad.write_text("not a key", encoding="ascii")
    assert (
        run(
            [
                "add-key",
                "agent-10",
                "--kind",
                "agent",
                "--file",
                str(path),
                "--public-key",
                str(bad),
            ]
        )
        == 1
    )


def test_usage_errors_return_2() -> None:
    assert run(["add-key", "x", "--kind", "robot", "--file", "f", "--generate", "g"]) == 2
