"""The access log (issue 14, item 7): one structured line per request, with its correlation id."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from service.accesslog import ACCESS_LOGGER
from service.app import create_app
from service.logs import JSONFormatter
from tests.auth import bearer, login
from tests.rawhttp import assert_problem, broken_authorization, exchange
from tests.servers import EdgeTestServer, serve

CID = "issue-14.item-7:cid"


def access_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == ACCESS_LOGGER]


async def logged(caplog: pytest.LogCaptureFixture, count: int = 1) -> list[logging.LogRecord]:
    """The access records, once ``count`` are there: aiohttp logs a request after writing its
    response, so the client may have read the response a moment before the line exists."""
    for _ in range(200):
        if len(access_records(caplog)) >= count:
            break
        await asyncio.sleep(0.005)
    return access_records(caplog)


def fields(record: logging.LogRecord) -> dict[str, Any]:
    return dict(record.fields)  # type: ignore[attr-defined]


async def test_a_401_access_line_carries_the_clients_correlation_id(client, caplog):
    with caplog.at_level(logging.INFO):
        response = await client.get("/api/v1/databases", headers={"X-Correlation-ID": CID})
        records = await logged(caplog)
    assert response.status == 401
    assert response.headers["X-Correlation-ID"] == CID
    [record] = records
    got = fields(record)
    assert record.correlation_id == CID  # type: ignore[attr-defined]
    assert got["correlation_id"] == CID
    assert got["method"] == "GET" and got["route"] == "/api/v1/databases"
    assert got["status"] == 401 and got["bytes"] > 0 and got["duration_ms"] >= 0
    assert "principal" not in got
    # Formatted as the process writes it: JSON, the id read from the record, not the context
    # (the middleware's context has ended when aiohttp logs the access line).
    doc = json.loads(JSONFormatter().format(record))
    assert doc["correlation_id"] == CID and doc["status"] == 401 and doc["event"] == "http.request"


async def test_the_access_line_names_the_route_template_and_the_principal(client, caplog):
    token = await login(client, "alice")
    with caplog.at_level(logging.INFO):
        response = await client.get("/api/v1/tasks/t-does-not-exist", headers=bearer(token))
        [record] = await logged(caplog)
    got = fields(record)
    assert got["status"] == response.status
    assert got["route"] == "/api/v1/tasks/{id}"
    assert got["principal"] == "alice" and got["principal_kind"] == "human"
    assert got["correlation_id"] == response.headers["X-Correlation-ID"]
    assert token not in caplog.text


async def test_an_unmatched_path_is_logged_without_a_route(client, caplog):
    with caplog.at_level(logging.INFO):
        response = await client.get("/no/such/path?token=abc")
        [record] = await logged(caplog)
    assert response.status == 404
    assert fields(record)["route"] is None
    assert fields(record)["correlation_id"] == response.headers["X-Correlation-ID"]


async def test_the_edges_own_answers_have_access_lines_too(make_config, caplog):
    server = EdgeTestServer(create_app(make_config({"server": {"max_header_bytes": 16384}})))
    await server.start_server()
    try:
        with caplog.at_level(logging.INFO):
            raw400 = await exchange(server, broken_authorization(b"\r"))
            head = b"".join(b"X-F%d: %s\r\n" % (i, b"b" * 1000) for i in range(20))
            raw431 = await exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + head)
            await logged(caplog, 2)
    finally:
        await server.close()
    doc400 = assert_problem(raw400, 400, "bad_request")
    doc431 = assert_problem(raw431, 431, "header_fields_too_large")
    lines = [fields(r) for r in access_records(caplog)]
    assert [(f["status"], f["correlation_id"]) for f in lines] == [
        (400, doc400["correlation_id"]), (431, doc431["correlation_id"])]


async def test_access_log_off_writes_no_access_line(make_config, caplog):
    server = EdgeTestServer(create_app(make_config()))
    await server.start_server(access_log=None)  # what cpctl serve passes for access_log: false
    try:
        with caplog.at_level(logging.INFO):
            await exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await asyncio.sleep(0.05)
    finally:
        await server.close()
    assert not access_records(caplog)


def test_cpctl_serve_writes_one_json_access_line_with_the_clients_id(tmp_path: Path):
    with serve(tmp_path / "state") as (base, proc):
        request = urllib.request.Request(base + "/api/v1/databases",  # noqa: S310 (loopback)
                                         headers={"X-Correlation-ID": CID})
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(request, timeout=10)  # noqa: S310 (loopback)
        failed.value.close()
        assert failed.value.code == 401
        deadline = time.monotonic() + 10
        while True:  # the line is written just after the response: wait for it
            log = proc.log_path.read_text()  # type: ignore[attr-defined]
            if CID in log or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        time.sleep(0.2)  # and a moment more, in case a second line were coming
        log = proc.log_path.read_text()  # type: ignore[attr-defined]
    docs = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    access = [d for d in docs if d["logger"] == ACCESS_LOGGER and d.get("correlation_id") == CID]
    assert len(access) == 1, access
    [line] = access
    assert line["status"] == 401 and line["method"] == "GET"
    assert line["route"] == "/api/v1/databases" and line["bytes"] > 0
    assert isinstance(line["duration_ms"], float)
    # aiohttp's own CLF text line is gone.
    assert not [d for d in docs if '" 401 ' in d["msg"]]



@pytest.mark.parametrize("masks", [[], ["route"], ["principal"], ["duration_ms"]],
                         ids=["made", "masked-route", "masked-principal", "masked-duration"])
@pytest.mark.parametrize(("method", "cid", "principal"), [
    ("GET", "cid-1 Bearer eyJhbGciOi.xyz", None),  # scrubbed either way
    ("GET", "0b8e2c1e-1e1e-4a4a-8b8b-123456789abc", "carol"),
    ("PATCH", None, "password=hunter2"),
    ("eyJhbGciOi.eyJzdWIi.c2ln", "", "carol"),
], ids=["secret-cid", "principal", "secret-subject", "odd-method"])
def test_the_direct_access_line_is_the_line_its_record_would_give(masks, method, cid, principal):
    """With the process's own handler alone on the way, the access logger formats and queues
    its line itself (no LogRecord): the same JSON as the record's, member for member and in
    the same order, masking and scrubbing included, whether the line is made directly (no
    field of it masked by name) or from its fields; anything else on the way (a capture, a
    filter) gets the record."""
    import io

    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request

    from service.accesslog import AccessLogger
    from service.appkeys import CORRELATION_ID
    from service.authn.principal import PRINCIPAL, Principal
    from service.logs import BatchedStreamHandler, direct_handler

    # A logger of its own: pytest hands its capture to every non-propagating logger it finds.
    logger = logging.getLogger(f"tests.accesslog.direct.{len(logging.root.manager.loggerDict)}")
    logger.propagate, logger.level = False, logging.INFO
    stream = io.StringIO()
    handler = BatchedStreamHandler(stream)
    handler.setFormatter(JSONFormatter(mask_fields=masks))
    logger.addHandler(handler)
    async def listing(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_get("/api/v1/databases", listing)
    request = make_mocked_request(method, "/api/v1/databases?token=abc", app=app)
    # The route as aiohttp's router matches it (none for a method it does not serve).
    request._match_info = asyncio.run(app.router.resolve(request))
    if cid is not None:
        request[CORRELATION_ID] = cid
    if principal is not None:
        request[PRINCIPAL] = Principal(principal, "human", "s1", 1.0, "password")
    response = web.Response(status=200, text="{}", headers={"X-Correlation-ID": "from-edge"})
    # A second request like the first, but for its id, duration and size: a line made from
    # the first one's template (``_line``) must carry its own.
    again = make_mocked_request(method, "/api/v1/databases", app=app)
    again._match_info = request._match_info
    if cid is not None:
        again[CORRELATION_ID] = cid + "-2" if cid else cid
    if principal is not None:
        again[PRINCIPAL] = Principal(principal, "human", "s1", 1.0, "password")

    class Sent(web.Response):  # as written: its head and body counted (a mocked one has none)
        body_length = 321

    bigger = Sent(status=200, text="{[]}", headers={"X-Correlation-ID": "from-edge-2"})

    def lines() -> list[dict[str, object]]:
        AccessLogger(logger, "").log(request, response, 0.0125)
        AccessLogger(logger, "").log(again, bigger, 0.5)
        found = [json.loads(line) for line in stream.getvalue().splitlines()]
        stream.seek(0), stream.truncate()
        return found

    try:
        assert direct_handler(logger, logging.INFO) is handler
        direct, direct_again = lines()
        logger.addFilter(lambda record: True)  # now the record path
        assert direct_handler(logger, logging.INFO) is None
        via_record, via_record_again = lines()
    finally:
        logger.removeHandler(handler)
        logger.filters.clear()
    del direct_again["ts"], via_record_again["ts"]
    assert list(direct_again.items()) == list(via_record_again.items())
    assert direct_again["duration_ms"] == ("***" if "duration_ms" in masks else 500.0)
    assert direct_again["bytes"] == 321 and direct["bytes"] != 321
    assert abs(time.time() - time.mktime(time.strptime(direct["ts"][:19], "%Y-%m-%dT%H:%M:%S"))
               + time.timezone) < 5
    del direct["ts"], via_record["ts"]
    assert list(direct.items()) == list(via_record.items())
    assert "eyJ" not in json.dumps(direct) and "hunter2" not in json.dumps(direct)
    assert direct["msg"].startswith(f"{direct['method']} ") and direct["status"] == 200
    if cid:  # the request's id, else the one on the response
        assert direct["correlation_id"] not in (None, "from-edge")
    else:
        assert direct["correlation_id"] == "from-edge"
    for name in masks:
        assert direct.get(name, "***") == "***"
