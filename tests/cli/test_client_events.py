"""The CLI's server-sent-events reader, and a ticket wait that survives a dropped stream."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from service.cli import approval
from service.cli.client import Client, ClientError, ServerEvent, _parse_events


def events(raw: bytes) -> list[ServerEvent]:
    return list(_parse_events(io.BytesIO(raw), "http://test"))


def test_fields_comments_and_line_endings() -> None:
    raw = (b": heartbeat\n\n"
           b"event: ticket\ndata: {\"a\":1}\n\n"
           b"id: 7\nevent: x\ndata: l1\r\ndata:l2\r\n\r\n"
           b"retry: 10\ndata: plain\n\n"
           b"data: never dispatched without a blank line")
    assert events(raw) == [
        ServerEvent("ticket", '{"a":1}', None),
        ServerEvent("x", "l1\nl2", "7"),
        ServerEvent("message", "plain", "7"),  # the last event id carries over
    ]


def test_an_oversized_line_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("service.cli.client.MAX_EVENT_LINE", 16)
    with pytest.raises(ClientError) as caught:
        events(b"data: " + b"x" * 32 + b"\n\n")
    assert caught.value.code == "bad_response"


def test_event_json_that_does_not_parse_is_a_bad_response() -> None:
    with pytest.raises(ClientError) as caught:
        ServerEvent("ticket", "{", None).json()
    assert caught.value.code == "bad_response"


def ticket(state: str) -> dict[str, Any]:
    return {"id": "tkt_" + "1" * 32, "state": state, "quorum": 1, "reviews": []}


class FlakyTicketServer(BaseHTTPRequestHandler):
    """First stream: the pending ticket, then the connection drops. Second: 429. Third: the
    approved ticket and the end."""

    answers: list[str] = []

    def do_GET(self) -> None:
        self.answers.append(self.headers.get("Accept", ""))
        attempt = len(self.answers)
        if attempt == 2:
            body = json.dumps({"status": 429, "code": "too_many_streams", "detail": "later",
                               "correlation_id": "c-1"}).encode()
            self.send_response(429)
            self.send_header("Content-Type", "application/problem+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        state = "pending" if attempt == 1 else "approved"
        self.wfile.write(b"event: ticket\ndata: " + json.dumps(ticket(state)).encode() + b"\n\n")
        if state == "approved":
            self.wfile.write(b'event: end\ndata: {"reason":"settled","state":"approved"}\n\n')

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def flaky_server() -> Iterator[str]:
    FlakyTicketServer.answers = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyTicketServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_wait_reconnects_after_a_drop_and_a_refusal(flaky_server: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("service.cli.client.RECONNECT_FIRST_S", 0.01)
    seen: list[str] = []
    final = approval.wait_for_ticket(Client(flaky_server, "token"), "tkt_" + "1" * 32,
                                     on_change=lambda t: seen.append(t["state"]))
    assert final["state"] == "approved"
    assert seen == ["pending", "approved"]
    assert FlakyTicketServer.answers == ["text/event-stream"] * 3


def test_wait_gives_up_on_a_refusal_that_is_not_temporary(flaky_server: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(self: FlakyTicketServer) -> None:
        body = b'{"status": 403, "code": "denied", "reasons": ["no_grant"], "correlation_id": "c-2"}'
        self.send_response(403)
        self.send_header("Content-Type", "application/problem+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    monkeypatch.setattr(FlakyTicketServer, "do_GET", forbidden)
    with pytest.raises(ClientError) as caught:
        approval.wait_for_ticket(Client(flaky_server, "token"), "tkt_" + "1" * 32)
    assert caught.value.code == "denied" and caught.value.reasons == ["no_grant"]
    assert "[reasons: no_grant] (correlation_id c-2)" in str(caught.value)


@pytest.mark.parametrize(("state", "code"), [
    pytest.param("approved", 0, id="approved"),
    pytest.param("rejected", 1, id="rejected"),
    pytest.param("revoked", 1, id="revoked"),
    pytest.param("consumed", 1, id="consumed"),
    pytest.param("expired", 2, id="expired"),
])
def test_wait_exit_codes(state: str, code: int, flaky_server: str, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    def settled(self: FlakyTicketServer) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b"event: ticket\ndata: " + json.dumps(ticket(state)).encode() + b"\n\n")

    monkeypatch.setattr(FlakyTicketServer, "do_GET", settled)
    monkeypatch.setenv("CONTROLPLANE_TOKEN", "token")
    assert approval.run(["wait", "tkt_" + "1" * 32, "--server", flaky_server]) == code
    assert f"is {state}" in capsys.readouterr().out
