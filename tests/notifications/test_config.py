"""The ``notifications`` configuration section and the Standard Webhooks signing it relies on."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest

from service.config import ConfigError, load
from service.notifications.signing import SignatureError, parse_secret, sign, verify

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def _load(**notifications: Any):
    return load(None, {}, overrides={"notifications": notifications})


def _hook(**changes: Any) -> dict[str, Any]:
    return {"name": "hook", "type": "webhook", "url": "https://h.example/x?token=abc",
            "secrets": [SECRET], **changes}


def test_a_valid_section_keeps_urls_and_secrets_secret() -> None:
    config = _load(sinks=[_hook(), {"name": "chat", "type": "slack",
                                    "url": "https://hooks.slack.example/T/B/XYZ"}],
                   public_url="https://cp.example/")
    text = repr(config)
    assert "token=abc" not in text and "XYZ" not in text and SECRET not in text
    assert config.notifications.public_url == "https://cp.example"
    assert [s.name for s in config.notifications.sinks] == ["hook", "chat"]


@pytest.mark.parametrize(("sinks", "extra", "message"), [
    pytest.param([_hook(secrets=[])], {}, "one or two signing secrets", id="no-secret"),
    pytest.param([_hook(secrets=["whsec_" + "!" * 20])], {}, "base64", id="bad-base64"),
    pytest.param([_hook(secrets=["nope"])], {}, "whsec_", id="no-prefix"),
    pytest.param([_hook(secrets=["whsec_" + base64.b64encode(b"k" * 8).decode()])], {},
                 "24..64 bytes", id="short-key"),
    pytest.param([{"name": "c", "type": "slack", "url": "https://s.example/x",
                   "secrets": [SECRET]}], {}, "only webhook sinks", id="slack-secret"),
    pytest.param([_hook(), _hook()], {}, "unique", id="duplicate-name"),
    pytest.param([_hook(url="ftp://h.example/x")], {}, "http:// or https://", id="scheme"),
    pytest.param([_hook(timeout_s=40)], {}, "lease_s", id="lease-shorter-than-attempts"),
    pytest.param([], {"backoff_base_s": 10, "backoff_max_s": 5}, "backoff", id="backoff"),
])
def test_bad_sections_are_refused(sinks, extra, message) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(sinks=sinks, **extra)
    assert message in str(caught.value)
    assert "token=abc" not in str(caught.value)


@pytest.mark.parametrize("sink", [
    pytest.param(_hook(secrets=[SECRET, SECRET, SECRET]), id="three-secrets"),
    pytest.param(_hook(type="email"), id="unknown-type"),
    pytest.param(_hook(events=["approval.exploded"]), id="unknown-event"),
    pytest.param(_hook(colour="red"), id="unknown-key"),
])
def test_the_schema_refuses_what_it_does_not_know(sink) -> None:
    with pytest.raises(ConfigError):
        _load(sinks=[sink])


def test_signatures_verify_with_either_rotation_secret() -> None:
    old, new = parse_secret(SECRET), b"n" * 32
    now = int(time.time())
    body = b'{"id":"x"}'
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(now),
               "webhook-signature": sign([new, old], "msg_1", now, body)}
    verify(old, headers, body, now)
    verify(new, headers, body, now)
    with pytest.raises(SignatureError):
        verify(b"x" * 32, headers, body, now)
    with pytest.raises(SignatureError):
        verify(old, headers, body + b" ", now)
    with pytest.raises(SignatureError):
        verify(old, {**headers, "webhook-id": "msg_2"}, body, now)
    with pytest.raises(SignatureError):
        verify(old, headers, body, now + 301)  # replay outside the tolerance
