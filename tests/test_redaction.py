"""The one list of secret field names, and that logs and audit records both use it."""

from __future__ import annotations

import pytest

from service import logs
from service.audit.record import scrub
from service.redaction import is_secret_field


@pytest.mark.parametrize("name", [
    "password", "Password", "access_token", "client_secret", "X-Api-Key", "api_key", "apiKey",
    "private_key", "otp", "nonce", "assertion", "Authorization", "dsn", "session_cookie",
    "credentials", "passphrase",
])
def test_secret_names(name: str) -> None:
    assert is_secret_field(name)


@pytest.mark.parametrize("name", [
    "compose_passed", "bypass", "subject_id", "session_id", "ticket_id", "resource_hash",
    "decision_id", "outcome", "keyboard", "privately",
])
def test_plain_names(name: str) -> None:
    assert not is_secret_field(name)


def test_logs_and_audit_agree_on_what_is_secret() -> None:
    entry = {"subject_id": "alice", "access_token": "t", "nested": [{"client_secret": "s"}],
             "compose_passed": True}
    masked = logs.mask(entry)
    scrubbed = scrub(entry)
    assert masked == {"subject_id": "alice", "access_token": logs.MASK,
                      "nested": [{"client_secret": logs.MASK}], "compose_passed": True}
    assert scrubbed == {"subject_id": "alice", "nested": [{}], "compose_passed": True}
