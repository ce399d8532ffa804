"""The identities file: schema, parsing, the shipped dev example, and counts by kind."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from service.authn import identities, passwords
from service.authn.identities import IdentitiesError
from service.authn.keyring import public_jwk

from .conftest import SERVICE_KEYS, identities_document

REPO = Path(__file__).resolve().parents[2]


def test_counts_by_kind(directory: identities.IdentityDirectory) -> None:
    assert directory.counts() == {"human": 2, "service": 1, "agent": 1, "disabled": 2}


def test_disabled_identities_are_not_active(directory: identities.IdentityDirectory) -> None:
    assert directory.get("dave") is not None
    assert directory.active("dave") is None
    assert directory.public_key_for("old-bot") is None
    assert directory.public_key_for("alice") is None  # humans sign no assertions
    assert directory.public_key_for("ci-bot") is not None


def test_repr_holds_no_secret(directory: identities.IdentityDirectory) -> None:
    alice = directory.get("alice")
    assert alice is not None and alice.password_hash and alice.totp_secret
    assert alice.password_hash not in repr(alice)
    assert alice.totp_secret not in repr(alice)


def test_dev_example_loads_and_its_passwords_verify() -> None:
    directory = identities.load(REPO / "examples" / "identities.yaml")
    assert directory.counts() == {"human": 3, "service": 1, "agent": 1, "disabled": 0}
    for name in ("alice", "bob", "carol"):
        identity = directory.get(name)
        assert identity is not None and identity.password_hash and identity.totp_secret
        assert passwords.verify_password(f"{name}-dev-password", identity.password_hash)
    for name in ("ci-bot", "agent-7"):
        assert (REPO / "examples" / "keys" / f"{name}.pem").is_file()


def test_public_key_as_jwk() -> None:
    doc = identities_document()
    doc["identities"][3]["public_key"] = public_jwk(SERVICE_KEYS["ci-bot"].public_key())
    directory = identities.parse(doc)
    assert directory.public_key_for("ci-bot") is not None


def _mutate(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(identities_document())
    target: Any = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    "document",
    [
        pytest.param(_mutate(("identities", 0, "roles"), ["admin"]), id="roles-are-not-here"),
        pytest.param(_mutate(("identities", 0, "kind"), "robot"), id="unknown-kind"),
        pytest.param(_mutate(("identities", 0, "password_hash"), "plain"), id="plain-password"),
        pytest.param(_mutate(("identities", 0, "totp_secret"), "short"), id="short-totp-secret"),
        pytest.param(_mutate(("identities", 1, "subject_id"), "alice"), id="duplicate-subject"),
        pytest.param(_mutate(("identities", 0, "subject_id"), "a:b"), id="colon-in-subject"),
        pytest.param(_mutate(("identities", 3, "public_key"), "not a key"), id="bad-public-key"),
        pytest.param(
            _mutate(("identities", 3, "public_key"), {"kty": "OKP", "crv": "Ed25519", "x": "A"}),
            id="bad-jwk",
        ),
        pytest.param(
            _mutate(("identities", 0, "password_hash"), "scrypt$ln=40,r=8,p=1$AAAA$BBBB"),
            id="hash-out-of-bounds",
        ),
        pytest.param({"identities": [], "extra": 1}, id="unknown-top-level-key"),
        pytest.param([], id="not-a-mapping"),
    ],
)
def test_bad_documents_are_refused(document: Any) -> None:
    with pytest.raises(IdentitiesError):
        identities.parse(document)


def test_duplicate_yaml_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "ids.yaml"
    path.write_text("identities: []\nidentities: []\n", encoding="utf-8")
    with pytest.raises(IdentitiesError, match="duplicate key"):
        identities.load(path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(IdentitiesError, match="cannot read"):
        identities.load(tmp_path / "absent.yaml")
