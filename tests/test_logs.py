"""Structured logs: JSON lines, correlation ids, and never a secret."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.app import DEV_IDENTITIES
from service.logs import JSONFormatter, configure, correlation_id_var, mask
from tests.conftest import json_log_lines

SECRET = "hunter2-Secret-Value"


def test_mask_hides_secret_fields_at_any_depth_and_url_credentials():
    doc = {"subject_id": "alice", "password": SECRET, "nested": [{"access_token": SECRET}],
           "note": f"postgresql://cp:{SECRET}@db/cp", "custom": SECRET}
    masked = mask(doc, extra_names=["custom"])
    text = json.dumps(masked)
    assert SECRET not in text
    assert masked["subject_id"] == "alice"
    assert "postgresql://cp:***@db/cp" in text


def test_formatter_writes_one_json_object_with_the_correlation_id():
    record = logging.LogRecord("controlplane.x", logging.INFO, __file__, 1,
                               "connecting to postgresql://u:%s@h/db", (SECRET,), None)
    record.fields = {"token": SECRET, "attempt": 2}
    token = correlation_id_var.set("cid-7")
    try:
        line = JSONFormatter().format(record)
    finally:
        correlation_id_var.reset(token)
    doc = json.loads(line)
    assert doc["correlation_id"] == "cid-7" and doc["attempt"] == 2
    assert SECRET not in line


@pytest.fixture
def json_log():
    """Capture every log record of the service as the JSON lines it would write."""
    with json_log_lines() as stream:
        yield stream


async def test_failed_logins_and_bad_tokens_leave_no_secret_in_logs(client, json_log):
    await client.post("/api/v1/authn/sessions", json={"subject_id": "alice", "password": SECRET})
    await client.get("/api/v1/databases", headers={"Authorization": f"Bearer {SECRET}.x.y"})
    await client.post("/api/v1/authn/step-up", json={"otp": "123456"},
                      headers={"Authorization": f"Bearer {SECRET}"})
    text = json_log.getvalue()
    assert text, "the service logged nothing"
    for line in text.splitlines():
        json.loads(line)
    assert SECRET not in text


async def test_unreachable_store_dsn_password_stays_out_of_logs(make_client, json_log):
    client = await make_client({"store": {"backend": "postgres", "postgres": {
        "dsn": f"postgresql://cp:{SECRET}@unreachable.invalid:5432/cp"}}})
    assert (await client.get("/readyz")).status == 503
    text = json_log.getvalue()
    assert "store unavailable" in text
    assert SECRET not in text and "unreachable.invalid:5432/cp" in text  # where, not who


async def test_production_mode_warns_about_dev_identities(make_client, json_log):
    # The dev file itself (make_config's default is a copy at a low password cost).
    client = await make_client({"mode": "production",
                                "authn": {"identities": str(DEV_IDENTITIES)}})
    assert (await client.get("/healthz")).status == 200
    warnings = [json.loads(line) for line in json_log.getvalue().splitlines()]
    assert any(w["level"] == "WARNING" and "DEVELOPMENT identities" in w["msg"] for w in warnings)


# A JWS-shaped fake token: the header line aiohttp's parser quotes when a CR, LF or NUL breaks it.
FAKE_JWS = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhbGljZSJ9.c2VjcmV0LXNpZ25hdHVyZQ"


@pytest.mark.parametrize("text", [
    pytest.param(f"b'Authorization: Bearer {FAKE_JWS[:30]}\\r{FAKE_JWS[30:]}'", id="cr-in-value"),
    pytest.param(f"b'Authorization: Bearer {FAKE_JWS[:30]}\\x00{FAKE_JWS[30:]}'", id="nul-in-value"),
    pytest.param(f"b'Autho\\x00rization: Bearer {FAKE_JWS[:30]}\\n{FAKE_JWS[30:]}'", id="nul-in-name"),
    pytest.param(f"proxy-authorization: Basic {SECRET}", id="basic"),
    pytest.param(f"{{'Cookie': 'sid={SECRET}; theme=dark'}}", id="cookie-dict"),
    pytest.param(f"GET /api/v1/x?access_token={SECRET}&page=2 HTTP/1.1", id="query"),
    pytest.param(f'{{"client_secret": "{SECRET}"}}', id="json"),
    pytest.param(f"X-Api-Key: {SECRET}", id="api-key-header"),
    pytest.param(f"token {FAKE_JWS} rejected", id="bare-jws"),
    pytest.param(f"ran mysql --password {SECRET} -e x", id="command-flag"),
    pytest.param(f"ran deploy --api-key '{SECRET}' web", id="command-flag-quoted"),
    pytest.param(f'ran deploy --password="x {SECRET}" web', id="command-named-quoted"),
])
def test_scrub_masks_credentials_in_any_text(text):
    from service.logs import scrub

    out = scrub(text)
    assert SECRET not in out and FAKE_JWS[30:] not in out and "c2VjcmV0" not in out, out
    assert "***" in out


# Fragments of every pattern's triggers, in any case, with separators and ordinary words around.
_FRAGMENTS = ["Authorization", "cookie", "Set-Cookie", "bearer ", "Basic ", "digest ", "eyJ", "EYJ",
              "://", "user:pw@", "@", ":", "=", " ", "'", '"', "\\r", "\x00", "_", "-", ".",
              "api", "Api", "key", "KEY", "private", "password", "Passwd", "token", "otp", "OTP",
              "nonce", "dsn", "secret", "credential", "assertion", "theme", "alice", "42",
              "http", "compose_passed", "bypass", "abc.def-ghi", "eyJhbGciOi", "J9", "\t", "\u2003",
              "\u017f", "\u212a", "BA\u017fIC ", "\u0130", "\u00df"]  # long s, Kelvin sign, I-dot, sharp s


_WORDS = ["api", "Api", "key", "KEY", "private", "access", "token", "client", "secret", "x", "pass",
          "word", "otp", "nonce", "dsn", "cookies", "credentials", "theme", "id"]
# name<sep>value pairs, whose name is made of words (a secret one or not) joined as people do
_PAIR = st.tuples(
    st.lists(st.sampled_from(_WORDS), min_size=1, max_size=3),
    st.sampled_from(["_", "-", ".", ""]),
    st.sampled_from([": ", "=", '": "', "':'", " = "]),
    st.sampled_from(["s3cr3t", "***", "alice", "42"]),
).map(lambda p: p[1].join(p[0]) + p[2] + p[3])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_FRAGMENTS), _PAIR), max_size=10).map("".join))
def test_scrub_prefilter_never_skips_a_match(text):
    """``scrub`` returns text untouched when no pattern's trigger is in it: that shortcut must
    give exactly what the patterns give."""
    from service.logs import _scrub_patterns, scrub

    assert scrub(text) == _scrub_patterns(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_FRAGMENTS), _PAIR), max_size=10).map("".join))
def test_remembered_clean_texts_are_exactly_the_texts_scrub_leaves(text):
    """Texts found clean are remembered (a repeat is one set lookup): the second answer is the
    first, and a text that held anything to mask is never remembered."""
    from service.logs import _CLEAN, _scrub_patterns, scrub

    first = scrub(text)
    assert scrub(text) == first == _scrub_patterns(text)
    if text in _CLEAN:
        assert first == text
    if first != text:
        assert text not in _CLEAN
    assert scrub("alice") == "alice" and "alice" in _CLEAN  # no trigger at all: remembered


def test_scrub_keeps_ordinary_text():
    from service.logs import scrub

    for text in ("token_too_large for alice; code: token_malformed", "compose_passed=True",
                 "purged 3 expired one-time claims", "GET /api/v1/tasks/build-1 HTTP/1.1"):
        assert scrub(text) == text


def test_formatter_scrubs_message_exception_and_fields():
    try:
        raise ValueError(f"Invalid header value char: b'Authorization: Bearer {FAKE_JWS}'")
    except ValueError:
        import sys

        exc_info = sys.exc_info()
    record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1,
                               "Error handling %s", (f"Bearer {FAKE_JWS}",), exc_info)
    record.fields = {"header": f"Authorization: Bearer {FAKE_JWS}", "list": [FAKE_JWS]}
    line = JSONFormatter().format(record)
    doc = json.loads(line)
    assert "ValueError" in doc["exc"] and "Traceback" in doc["exc"]
    assert FAKE_JWS[30:] not in line and "c2VjcmV0" not in line


def test_library_records_are_scrubbed_before_any_handler(caplog):
    from service.logs import install_scrubbing

    install_scrubbing()
    with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
        try:
            raise ValueError(f"b'Authorization: Bearer {FAKE_JWS[:25]}\\r{FAKE_JWS[25:]}'")
        except ValueError:
            logging.getLogger("aiohttp.server").exception("from %s", f"Bearer {FAKE_JWS}")
    assert caplog.records and "ValueError" in caplog.text
    assert FAKE_JWS[25:] not in caplog.text and "c2VjcmV0" not in caplog.text


class _CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


async def test_the_lines_of_a_request_are_written_together_and_all_of_them(client, monkeypatch):
    """The service's handler (``logs.configure``) writes the lines of one event-loop turn in
    one write: a burst of lines logged in one turn costs one write, and every line is out (in
    order) as soon as the loop turns."""
    stream = _CountingStream()
    monkeypatch.setattr(sys, "stderr", stream)
    previous = logging.getLogger().level
    configure("INFO")
    try:
        log = logging.getLogger("controlplane.test")
        for n in range(5):
            log.info("line %d", n)
        assert stream.getvalue() == ""  # queued until the loop's turn ends
        await asyncio.sleep(0)
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert [line["msg"] for line in lines] == [f"line {n}" for n in range(5)]
        assert stream.writes == 1
        # Through the app: a request's lines (its access line included) all arrive.
        response = await client.get("/api/v1/system/info")
        assert response.status == 200
        for _ in range(100):
            if '"controlplane.access"' in stream.getvalue():
                break
            await asyncio.sleep(0.01)
        assert '"controlplane.access"' in stream.getvalue()
        # Off the loop (a thread) a line is written at once.
        before = stream.writes
        await asyncio.to_thread(log.info, "from a thread")
        assert stream.writes == before + 1 and "from a thread" in stream.getvalue()
    finally:
        root = logging.getLogger()
        for handler in list(root.handlers):
            if getattr(handler, "_controlplane", False):
                root.removeHandler(handler)
        root.setLevel(previous)
