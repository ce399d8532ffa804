"""The console over HTTP: sign-in and its cookie, CSRF, CSP, escaping, the review rules, step-up,
logout, the live inbox, on the real app and store (SQLite; the review flow on PostgreSQL too)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from service import consolesession as cookies
from service.authn.sessions import AUTHENTICATOR
from service.console.views import CSP
from service.notifications.envelope import console_url
from service.storelink import STORE
from tests.auth import bearer, login, otp
from tests.console.console import COMMANDS, Visitor, request_ticket, token_of
from tests.console.test_console_cookies import sign_in as https_sign_in
from tests.store.pg import temp_schema


@pytest.fixture
async def visitors(client: TestClient) -> AsyncIterator[list[Visitor]]:
    made: list[Visitor] = []
    yield made
    for visitor in made:
        await visitor.close()


async def signed_in(client: TestClient, visitors: list[Visitor], subject: str) -> Visitor:
    visitor = Visitor(client)
    visitors.append(visitor)
    response = await visitor.sign_in(subject)
    assert response.status == 303, await response.text()
    return visitor


def console_headers_ok(response: Any) -> None:
    assert response.headers["Content-Security-Policy"] == CSP
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
    assert response.headers["X-Frame-Options"] == "DENY"


async def test_root_redirects_and_pages_need_a_session(client, visitors):
    visitor = Visitor(client)
    visitors.append(visitor)
    root = await visitor.get("/")
    assert root.status == 303 and root.headers["Location"] == "/console/"
    for path in ("/console/", "/console/requests", "/console/tickets/x", "/console/tickets/x/audit"):
        response = await visitor.get(path)
        assert response.status == 303, path
        assert response.headers["Location"].startswith("/console/login?next=%2Fconsole%2F"), path
        console_headers_ok(response)
    stream = await visitor.get("/console/inbox/events")
    assert stream.status == 401


async def test_the_link_in_notifications_is_the_ticket_page(client, visitors):
    """Webhook and Slack payloads link ``{public_url}/console/tickets/{id}``: that path is the
    console's page of that very ticket (the browser test follows the inbox link to it too)."""
    ticket = await request_ticket(client, reason="the link in the message")
    link = console_url("https://cp.example.test", ticket["id"])
    assert link is not None and link.startswith("https://cp.example.test/console/")
    bob = await signed_in(client, visitors, "bob")
    page = await bob.page(link.removeprefix("https://cp.example.test"))
    assert f'data-stream="/console/tickets/{ticket["id"]}/events"' in page
    assert f"<code>{ticket['id']}</code>" in page and 'id="state"' in page


async def test_sign_in_sets_a_strict_cookie_that_the_api_refuses(client, visitors):
    visitor = Visitor(client)
    visitors.append(visitor)
    await visitor.page("/console/login")
    response = await visitor.post("/console/login", {
        "csrf": visitor.csrf, "subject_id": "bob", "password": "bob-dev-password",
        "next": "/console/requests"})
    assert response.status == 303 and response.headers["Location"] == "/console/requests"
    set_cookie = [h for h in response.headers.getall("Set-Cookie") if h.startswith("cp_console=")]
    assert len(set_cookie) == 1
    flags = set_cookie[0].lower()
    assert "httponly" in flags and "samesite=strict" in flags and "path=/console" in flags
    assert "secure" not in flags  # plain HTTP here; over TLS the cookie is Secure
    value = visitor.cookie()
    assert value
    # The API is bearer-only: the cookie is not a credential there, neither as a cookie nor as
    # a bearer token (its own JWS type).
    as_cookie = await client.get("/api/v1/approvals", headers={"Cookie": f"cp_console={value}"})
    assert as_cookie.status == 401
    as_bearer = await client.get("/api/v1/approvals", headers=bearer(value))
    assert as_bearer.status == 401
    assert (await as_bearer.json())["code"] == "token_type_mismatch"
    # Nothing token-like reaches the page: only the CSRF token, which is not a credential.
    text = await visitor.page("/console/")
    assert value not in text and "access_token" not in text
    # A bearer token on a console request is ignored: the console reads its cookie only.
    bob = await login(client, "bob")
    anonymous = Visitor(client)
    visitors.append(anonymous)
    assert (await anonymous.get("/console/", headers=bearer(bob))).status == 303


async def test_wrong_password_and_open_redirects(client, visitors):
    visitor = Visitor(client)
    visitors.append(visitor)
    refused = await visitor.sign_in("bob", "wrong")
    assert refused.status == 401
    assert 'data-code="invalid_credentials"' in await refused.text()
    assert visitor.cookie() is None
    for evil in ("https://evil.example/", "//evil.example/", "/console/\\evil", "/api/v1/approvals"):
        await visitor.page("/console/login")
        response = await visitor.post("/console/login", {
            "csrf": visitor.csrf, "subject_id": "bob", "password": "bob-dev-password", "next": evil})
        assert response.headers["Location"] == "/console/", evil
        visitor.http.cookie_jar.clear_domain("127.0.0.1")


async def test_posts_without_the_csrf_token_are_refused(client, visitors):
    ticket = await request_ticket(client)
    bob = await signed_in(client, visitors, "bob")
    path = f"/console/tickets/{ticket['id']}/review"
    for form, headers in (
        ({"decision": "approve", "otp": otp("bob", client.server.app)}, {}),  # no token
        ({"decision": "approve", "csrf": "x" * 43}, {}),  # someone else's token
        ({"decision": "approve", "csrf": bob.csrf}, {"Origin": "https://evil.example"}),
    ):
        response = await bob.post(path, form, headers=headers)
        assert response.status == 403
        assert (await response.json())["code"] == "csrf_failed"
    logout = await bob.post("/console/logout", {})
    assert logout.status == 403
    # The pre-session token guards the sign-in form too (login CSRF).
    fresh = Visitor(client)
    visitors.append(fresh)
    response = await fresh.post("/console/login", {"subject_id": "bob", "password": "bob-dev-password"})
    assert response.status == 403 and fresh.cookie() is None
    ticket_now = await api_ticket(client, ticket["id"])
    assert ticket_now["state"] == "pending" and ticket_now["reviews"] == []


async def test_every_console_response_carries_the_csp(client, visitors):
    ticket = await request_ticket(client)
    bob = await signed_in(client, visitors, "bob")
    for path in ("/", "/console/login", "/console/", "/console/requests",
                 f"/console/tickets/{ticket['id']}", f"/console/tickets/{ticket['id']}/audit",
                 "/console/tickets/nope", "/console/static/console.js",
                 "/console/static/console.css", "/console/static/other.js"):
        response = await bob.get(path)
        console_headers_ok(response)
    js = await bob.get("/console/static/console.js")
    assert js.status == 200 and js.content_type == "text/javascript"
    missing = await bob.get("/console/tickets/nope")
    assert missing.status == 404 and 'data-code="ticket_not_found"' in await missing.text()
    # No inline script or style anywhere in a page.
    text = await bob.page(f"/console/tickets/{ticket['id']}")
    assert re.findall(r"<script(?![^>]*\bsrc=)", text) == [] and "style=" not in text
    assert "<style" not in text and " on" not in re.sub(r">[^<]*<", "><", text)


async def test_hostile_reason_resource_and_command_render_inert(client, visitors):
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    ticket = await request_ticket(client, reason=hostile, resource={"app": hostile, "n": 1},
                                  command=["sh", "-c", hostile])
    bob = await signed_in(client, visitors, "bob")
    for path in ("/console/", f"/console/tickets/{ticket['id']}",
                 f"/console/tickets/{ticket['id']}/audit"):
        text = await bob.page(path)
        assert "<script>alert" not in text and "<img src=x" not in text, path
        if not path.endswith("/audit"):  # audit records hold the resource's hash, not the text
            assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text, path
    if COMMANDS:
        text = await bob.page(f"/console/tickets/{ticket['id']}")
        assert "sh -c &#x27;&lt;script&gt;" in text


async def review(visitor: Visitor, ticket_id: str, decision: str, **extra: str) -> Any:
    await visitor.page(f"/console/tickets/{ticket_id}")
    return await visitor.post(f"/console/tickets/{ticket_id}/review",
                              {"csrf": visitor.csrf, "decision": decision, **extra})


async def api_ticket(client: TestClient, ticket_id: str) -> dict[str, Any]:
    token = await token_of(client, "bob")
    return dict(await (await client.get(f"/api/v1/approvals/{ticket_id}", headers=bearer(token))).json())


async def test_self_review_is_refused_as_in_the_api(client, visitors):
    ticket = await request_ticket(client)
    alice = await signed_in(client, visitors, "alice")
    text = await alice.page(f"/console/tickets/{ticket['id']}")
    assert 'data-code="self_review"' in text and 'name="decision"' not in text
    response = await review(alice, ticket["id"], "approve", otp=otp("alice", client.server.app))
    assert response.status == 403
    assert 'data-code="self_review"' in await response.text()
    assert (await api_ticket(client, ticket["id"]))["state"] == "pending"
    # Nor does it appear in her inbox.
    assert ticket["id"] not in await alice.page("/console/")


async def test_an_agent_cannot_review_through_the_console(client, visitors):
    ticket = await request_ticket(client)
    # Agents have no password: the sign-in form refuses them.
    visitor = Visitor(client)
    visitors.append(visitor)
    assert (await visitor.sign_in("agent-7", "anything")).status == 401
    # Even holding a console cookie for its own live session, the review rule refuses it.
    token = await login(client, "agent-7")
    app = client.server.app
    principal = await app[AUTHENTICATOR].authenticate_bearer(token, time.time())
    value, csrf = cookies.issue(app[AUTHENTICATOR], principal, expires_at=principal.auth_time + 600,
                                now=principal.auth_time)
    visitor.http.cookie_jar.update_cookies({"cp_console": value}, visitor.base)
    response = await visitor.post(f"/console/tickets/{ticket['id']}/review",
                                  {"csrf": csrf, "decision": "approve"})
    assert response.status == 403
    assert 'data-code="reviewer_not_human"' in await response.text()
    assert (await api_ticket(client, ticket["id"]))["state"] == "pending"


async def test_the_ticket_page_masks_a_password_in_the_command(client, visitors):
    line = "mysql --host db --password hunter2 -e 'select 1'"
    ticket = await request_ticket(client, reason="a password on the command line", command=line)
    bob = await signed_in(client, visitors, "bob")
    text = await bob.page(f"/console/tickets/{ticket['id']}")
    assert "hunter2" not in text
    assert "mysql --host db --password ***" in text
    argv = await request_ticket(client, reason="as an argv array",
                                command=["mysql", "--password", "hunter2", "-e", "select 1"])
    text = await bob.page(f"/console/tickets/{argv['id']}")
    assert "hunter2" not in text and "mysql --password *** -e &#x27;select 1&#x27;" in text


async def approve_with_step_up(client: TestClient, visitors: list[Visitor]) -> None:
    ticket = await request_ticket(client, reason="release 1.2.3", command="helm upgrade web ./chart")
    bob = await signed_in(client, visitors, "bob")
    text = await bob.page(f"/console/tickets/{ticket['id']}")
    assert 'name="otp"' in text  # the inline step-up prompt: prod needs a fresh step-up
    # Without the code: 401, the prompt again, the reason kept.
    response = await review(bob, ticket["id"], "approve", reason="CHG-42")
    assert response.status == 401
    body = await response.text()
    assert 'data-code="step_up_required"' in body and "CHG-42</textarea>" in body
    wrong = await review(bob, ticket["id"], "approve", reason="CHG-42", otp="000000")
    assert wrong.status == 401 and 'data-code="otp_invalid"' in await wrong.text()
    done = await review(bob, ticket["id"], "approve", reason="CHG-42",
                        otp=otp("bob", client.server.app))
    assert done.status == 303 and done.headers["Location"] == f"/console/tickets/{ticket['id']}"
    stored = await api_ticket(client, ticket["id"])
    assert stored["state"] == "approved"
    assert [(r["reviewer"], r["reason"]) for r in stored["reviews"]] == [("bob", "CHG-42")]
    text = await bob.page(f"/console/tickets/{ticket['id']}")
    assert 'id="state">approved<' in text and ">1 of 1<" in text and 'name="decision"' not in text
    assert "approved (review)" in text  # the timeline, from the ticket's audit records
    audit = await bob.page(f"/console/tickets/{ticket['id']}/audit")
    assert '&quot;action&quot;: &quot;approvals.review&quot;' in audit
    # The step-up stays on the session: the next prod review needs no code.
    second = await request_ticket(client)
    assert 'name="otp"' not in await bob.page(f"/console/tickets/{second['id']}")
    rejected = await review(bob, second["id"], "reject", reason="not now")
    assert rejected.status == 303
    assert (await api_ticket(client, second["id"]))["state"] == "rejected"


async def test_approve_with_inline_step_up(client, visitors):
    await approve_with_step_up(client, visitors)


@pytest.mark.postgres
async def test_approve_with_inline_step_up_on_postgresql(make_client):
    async with temp_schema("cp_console") as (dsn, schema):
        client = await make_client({"store": {"backend": "postgres",
                                              "postgres": {"dsn": dsn, "schema": schema}}})
        made: list[Visitor] = []
        try:
            await approve_with_step_up(client, made)
        finally:
            for visitor in made:
                await visitor.close()


async def test_logout_anywhere_ends_the_console_session(client, visitors):
    bob = await signed_in(client, visitors, "bob")
    value = bob.cookie()
    assert (await bob.get("/console/")).status == 200
    out = await bob.post("/console/logout", {"csrf": bob.csrf})
    assert out.status == 303 and bob.cookie() is None
    replay = Visitor(client)
    visitors.append(replay)
    replay.http.cookie_jar.update_cookies({"cp_console": value}, replay.base)
    assert (await replay.get("/console/")).status == 303  # the store session is revoked
    # A session ended elsewhere (here: in the store, as a disabled identity's would be).
    again = await signed_in(client, visitors, "bob")
    store = client.server.app[STORE].require()
    assert await store.revoke_subject_sessions("bob", time.time()) >= 1
    assert (await again.get("/console/")).status == 303


async def read_event(response: Any, name: str, timeout: float = 10.0) -> dict[str, Any]:
    """The data of the next ``event: name`` of an SSE response."""
    async def next_event() -> dict[str, Any]:
        event, data = None, []
        while True:
            line = (await response.content.readline()).decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and event is not None:
                if event == name:
                    return dict(json.loads("\n".join(data)))
                event, data = None, []

    return await asyncio.wait_for(next_event(), timeout)


async def test_the_inbox_updates_live_and_lists_oldest_first(client, visitors):
    first = await request_ticket(client, reason="first")
    bob = await signed_in(client, visitors, "bob")
    stream = await bob.get("/console/inbox/events", headers={"Accept": "text/event-stream"})
    assert stream.status == 200 and stream.content_type == "text/event-stream"
    console_headers_ok(stream)
    html = (await read_event(stream, "inbox"))["html"]
    assert first["id"] in html
    second = await request_ticket(client, reason="second", command=["helm", "upgrade", "web"])
    html = (await read_event(stream, "inbox"))["html"]
    assert html.index(first["id"]) < html.index(second["id"])  # oldest first
    if COMMANDS:
        assert "helm upgrade web" in html
    stream.close()
    page = await bob.page("/console/")
    assert page.index(first["id"]) < page.index(second["id"])
    assert 'class="countdown"' in page and 'data-label="review by"' in page
    mine = await signed_in(client, visitors, "alice")
    requests = await mine.page("/console/requests")
    assert first["id"] in requests and second["id"] in requests and "state-pending" in requests


async def test_only_a_valid_console_cookie_signs_in(client, visitors):
    """Tampered, foreign-typed (an API access token) or expired cookies are no session."""
    bob = await signed_in(client, visitors, "bob")
    value = bob.cookie()
    assert value is not None
    header, payload, signature = value.split(".")
    flipped = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BA")
    app = client.server.app
    principal = (await cookies.verify(app[AUTHENTICATOR], value, time.time())).principal
    expired, _ = cookies.issue(app[AUTHENTICATOR], principal, expires_at=time.time() - 3600,
                               now=time.time() - 7200)
    for forged in (f"{header}.{payload}.{flipped}", await token_of(client, "bob"), expired,
                   "not-a-token", value + "x"):
        visitor = Visitor(client)
        visitors.append(visitor)
        visitor.http.cookie_jar.update_cookies({"cp_console": forged}, visitor.base)
        response = await visitor.get("/console/")
        assert response.status == 303 and response.headers["Location"].startswith("/console/login")
    assert (await bob.get("/console/")).status == 200


async def test_a_ticket_requested_through_another_instance_shows_live(aiohttp_client, make_config,
                                                                      visitors):
    """Two app instances on one store (as two workers or replicas are): the inbox stream of one
    shows a ticket requested through the other, because it reads the store, not its process."""
    from service.app import create_app
    from tests.servers import EdgeTestServer

    config = make_config()
    first = await aiohttp_client(EdgeTestServer(create_app(config)))
    second = await aiohttp_client(EdgeTestServer(create_app(config)))
    bob = await signed_in(second, visitors, "bob")
    stream = await bob.get("/console/inbox/events", headers={"Accept": "text/event-stream"})
    assert stream.status == 200
    assert "Nothing waits for your review" in (await read_event(stream, "inbox"))["html"]
    ticket = await request_ticket(first, reason="through the other instance")
    assert ticket["id"] in (await read_event(stream, "inbox"))["html"]
    # A logout through the other instance ends the stream (its session is re-checked).
    assert await first.server.app[STORE].require().revoke_subject_sessions("bob", time.time())
    assert (await read_event(stream, "end")) == {"reason": "session_ended"}
    stream.close()


async def test_the_ticket_page_stream_follows_the_ticket_to_its_end(client, visitors):
    ticket = await request_ticket(client)
    bob = await signed_in(client, visitors, "bob")
    stream = await bob.get(f"/console/tickets/{ticket['id']}/events")
    assert stream.status == 200 and stream.content_type == "text/event-stream"
    console_headers_ok(stream)
    assert await read_event(stream, "ticket") == {"state": "pending", "reviews": 0}
    revoked = await client.post(f"/api/v1/approvals/{ticket['id']}/revoke",
                                headers=bearer(await token_of(client, "alice")))
    assert revoked.status == 200
    assert await read_event(stream, "ticket") == {"state": "revoked", "reviews": 0}
    assert await read_event(stream, "end") == {"reason": "final"}
    assert (await bob.get("/console/tickets/nope/events")).status == 404


async def test_behind_a_tls_proxy_the_cookie_is_secure_and_https_origins_pass(client, visitors):
    # (The cookies' names and flags over HTTPS: test_console_cookies.py.)
    host = client.make_url("").authority
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        response, jar = await https_sign_in(http, str(client.make_url("")).rstrip("/"), "bob", {
            "X-Forwarded-Proto": "https", "Origin": f"https://{host}"})
    assert response.status == 303
    assert jar["__Host-cp_console"]["secure"] is True
    # A foreign host is refused whatever the scheme.
    other = Visitor(client)
    visitors.append(other)
    await other.page("/console/login")
    refused = await other.post("/console/login", {
        "csrf": other.csrf, "subject_id": "bob", "password": "bob-dev-password"},
        headers={"Origin": "https://evil.example"})
    assert refused.status == 403


async def test_a_console_cookie_alone_does_not_authorise_an_api_mutation(client, visitors):
    """The API takes bearer tokens only: a signed-in browser's console cookie (what a foreign
    page could make it send) reviews nothing there, under either of its names, and the
    ticket stays pending; the same person's review through the console form works."""
    ticket = await request_ticket(client)
    bob = await signed_in(client, visitors, "bob")
    value = bob.cookie()
    assert value is not None
    path = f"/api/v1/approvals/{ticket['id']}/reviews"
    for headers in ({"Cookie": f"cp_console={value}"},
                    {"Cookie": f"__Host-cp_console={value}", "X-Forwarded-Proto": "https"}):
        response = await client.post(path, json={"decision": "approve"}, headers=headers)
        assert response.status == 401, await response.text()
        assert (await response.json())["code"] == "unauthenticated"
    assert (await api_ticket(client, ticket["id"]))["state"] == "pending"
    done = await review(bob, ticket["id"], "approve", otp=otp("bob", client.server.app))
    assert done.status == 303
    assert (await api_ticket(client, ticket["id"]))["state"] == "approved"
