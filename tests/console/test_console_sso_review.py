"""A person signed in through the organisation's OpenID provider reviews like anyone else: one
function (``approvals.policy.review_check``) decides who may review, for the API, the console's
inbox and ticket page, and the suggested reviewers of notifications and of the ticket page.

The real OpenID provider process (node-oidc-provider on loopback), as in test_console_sso.py:
rita's role comes from her IdP group ``approvers`` (``group_bindings`` in policy data), and she
is in the reviewer group production tickets need; sam has the same IdP group but is not."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
import uuid
from html import unescape
from pathlib import Path

import pytest

from service.app import create_app
from service.authn import totp
from service.authn.sessions import AUTHENTICATOR
from service.authz.engine import ENGINE
from service.config import CONFIG
from service.notifications.reviewers import reviewers_of
from service.store.base import OutboxEvent
from service.storelink import STORE
from tests.auth import TOTP_SECRETS, bearer
from tests.authn.openid_provider import CLIENT_ID, CLIENT_SECRET, Browser, openid_provider, url
from tests.console.console import Visitor, request_ticket, token_of
from tests.console.test_console_browser import (  # noqa: F401 (browser_required: a fixture)
    CHROMIUM,
    CHROMIUM_ARGS,
    browser_required,
    execute,
    start_cpctl,
)
from tests.cpctl import PROCESS_TIMEOUT_S, finish
from tests.servers import REPO, EdgeTestServer

ACCOUNTS = {
    "rita": {"email": "rita@example.com", "email_verified": True, "groups": ["approvers"]},
    "sam": {"email": "sam@example.com", "email_verified": True, "groups": ["approvers"]},
}
RITA, SAM = "test:rita@example.com", "test:sam@example.com"


@pytest.fixture(scope="module")
def issuer(ports, tmp_path_factory):
    app_port, op_port = ports
    callback = f"http://127.0.0.1:{app_port}/api/v1/authn/oidc/test/callback"
    with openid_provider(op_port, [callback], ACCOUNTS, tmp_path_factory.mktemp("op")) as url:
        yield url


def sso_policies(tmp_path):
    """The shipped policies, plus: IdP group ``test:approvers`` -> approver; rita (by her
    federated subject) in the reviewer group ``sre-approvers`` production tickets need."""
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    bindings = policies / "data" / "bindings.yaml"
    text = bindings.read_text().replace("sre-approvers: [bob, erin]",
                                        f'sre-approvers: [bob, erin, "{RITA}"]')
    assert RITA in text
    bindings.write_text(text + "\ngroup_bindings:\n  test:approvers: {roles: [approver]}\n")
    return policies


@pytest.fixture
async def app_client(aiohttp_client, make_config, ports, issuer, tmp_path):
    app_port, _ = ports
    config = make_config({"policies": {"dir": str(sso_policies(tmp_path))}, "authn": {"oidc": {
        "allow_http_loopback": True, "redirect_base_url": f"http://127.0.0.1:{app_port}",
        "providers": [{"name": "test", "display_name": "Test IdP", "issuer": issuer,
                       "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                       "scopes": ["openid", "email", "groups"], "subject_claim": "email",
                       "allowed_domains": ["example.com"]}]}}})
    return await aiohttp_client(EdgeTestServer(create_app(config), port=app_port))


async def console_sign_in(client, browser: Browser, login: str) -> None:
    """Sign in to the console with the provider, as the browser does (link, form, callback)."""
    status, _, _ = await browser.go(url(client, "/api/v1/authn/oidc/test/login?next=/console/"),
                                    login=login)
    assert status == 200  # the callback's page that moves on to the console


async def console_page(client, browser: Browser, path: str) -> str:
    async with browser.http.get(url(client, path), allow_redirects=False) as resp:
        assert resp.status == 200, (resp.status, await resp.text())
        return await resp.text()


async def api_token(client, browser: Browser, login: str) -> str:
    """An API sign-in through the provider, stepped up there (as ``cpctl step-up --sso``)."""
    status, _, body = await browser.go(url(client, "/api/v1/authn/oidc/test/login"), login=login)
    assert status == 201, body
    async with browser.http.post(url(client, "/api/v1/authn/oidc/test/step-up"),
                                 headers=bearer(body["access_token"])) as resp:
        authorization_url = (await resp.json())["authorization_url"]
    status, _, stepped = await browser.go(authorization_url, login=login)
    assert status == 201, stepped
    return str(stepped["access_token"])


async def suggested(client, ticket_id: str) -> list[str]:
    """What an ``approval.requested`` notification names as suggested reviewers."""
    app = client.app
    reviewers = reviewers_of(app[ENGINE], app[CONFIG], lambda: app[AUTHENTICATOR].identities)
    event = OutboxEvent(id=str(uuid.uuid4()), type="approval.requested", ticket_id=ticket_id,
                        env="prod", at=0.0, data={})
    return list(await reviewers(app[STORE].require(), event, time.time()) or [])


async def test_an_sso_approver_reviews_in_the_console_as_through_the_api(app_client):
    client = app_client
    ticket = await request_ticket(client, "alice")
    rita, sam, sam_cli = Browser(), Browser(), Browser()
    try:
        await console_sign_in(client, rita, "rita")
        await console_sign_in(client, sam, "sam")

        # rita's inbox offers the ticket, and its page the review form (her role comes from her
        # IdP group, her reviewer group from policy data).
        inbox = await console_page(client, rita, "/console/")
        assert f'data-ticket="{ticket["id"]}"' in inbox, inbox
        page = await console_page(client, rita, f"/console/tickets/{ticket['id']}")
        assert 'name="decision"' in page and "another role" not in page, page

        # sam has the role but not the reviewer group: the console and the API refuse an
        # approval naming the group that is missing.
        page = await console_page(client, sam, f"/console/tickets/{ticket['id']}")
        refusal = re.search(r'data-code="(reviewer_group_required)"[^>]*>([^<]+)<', page)
        assert refusal is not None, page
        assert "sre-approvers" in unescape(refusal.group(2))
        response = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                                     headers=bearer(await api_token(client, sam_cli, "sam")),
                                     json={"decision": "approve"})
        problem = await response.json()
        assert (response.status, problem["code"]) == (403, "reviewer_group_required"), problem
        assert "sre-approvers" in problem["detail"]

        # The suggested reviewers (notifications, and the ticket's page) include rita, not sam.
        names = await suggested(client, ticket["id"])
        assert RITA in names and "bob" in names and SAM not in names, names
        page = await console_page(client, rita, f"/console/tickets/{ticket['id']}")
        shown = re.search(r'<ul [^>]*id="reviewers"[^>]*>(.*?)</ul>', page, re.S)
        assert shown is not None and RITA in shown.group(1) and SAM not in shown.group(1), page
    finally:
        for browser in (rita, sam, sam_cli):
            await browser.close()


async def test_an_sso_approver_steps_up_at_the_provider_in_the_console(app_client):
    """The production ticket's page offers "Confirm at the sign-in provider": it sends the
    browser to the provider for a fresh login, and back to the ticket with the console session
    stepped up; the approval then goes through."""
    client = app_client
    ticket = await request_ticket(client, "alice")
    path = f"/console/tickets/{ticket['id']}"
    rita = Browser()
    try:
        await console_sign_in(client, rita, "rita")
        page = await console_page(client, rita, path)
        assert f'href="{path}/step-up"' in page and 'name="otp"' not in page, page
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        # Approving before stepping up is refused, saying where to confirm (not a TOTP code).
        async with rita.http.post(url(client, f"{path}/review"), allow_redirects=False,
                                  data={"csrf": csrf.group(1), "decision": "approve"}) as resp:
            assert resp.status == 401, await resp.text()
            assert 'data-code="step_up_required_sso"' in await resp.text()
        async with rita.http.get(url(client, f"{path}/step-up"), allow_redirects=False) as resp:
            assert resp.status == 302, await resp.text()
            to_provider = resp.headers["Location"]
        assert "prompt=login" in to_provider and "max_age=0" in to_provider
        logins = rita.logins
        status, _, landed = await rita.go(to_provider, login="rita")
        assert status == 200 and rita.logins == logins + 1  # signed in again at the provider
        assert "Confirmed at the sign-in provider as" in landed and path in landed, landed

        page = await console_page(client, rita, path)
        assert f'href="{path}/step-up"' not in page, page
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        async with rita.http.post(url(client, f"{path}/review"), allow_redirects=False,
                                  data={"csrf": csrf.group(1), "decision": "approve",
                                        "reason": "CHG-7"}) as resp:
            assert resp.status == 303, await resp.text()
        response = await client.get(f"/api/v1/approvals/{ticket['id']}",
                                    headers=bearer(await token_of(client, "alice")))
        approved = await response.json()
        assert approved["state"] == "approved", approved
        assert [r["reviewer"] for r in approved["reviews"]] == [RITA]

    finally:
        await rita.close()
    # Without a console session (e.g. a navigation from another site, which does not carry the
    # SameSite=Strict cookie) it starts nothing: the sign-in page.
    response = await client.get(f"{path}/step-up", allow_redirects=False)
    assert response.status == 303 and response.headers["Location"].startswith("/console/login")
    # A password session has no provider to confirm at.
    bob = Visitor(client)
    try:
        assert (await bob.sign_in("bob")).status == 303
        response = await bob.get(f"{path}/step-up")
        assert response.status == 403
        assert 'data-code="step_up_not_available"' in await response.text()
    finally:
        await bob.close()


@pytest.mark.usefixtures("browser_required")
async def test_an_sso_approver_approves_in_a_real_browser_and_the_run_executes(
        app_client, tmp_path: Path) -> None:
    """Real Chromium against the test provider: rita (approver through her IdP group) signs in
    with "Sign in with Test IdP", sees alice's waiting production run in her inbox, confirms at
    the provider (a fresh login there) and approves; alice's waiting ``cpctl installer run``
    then runs with the ticket."""
    from playwright.async_api import async_playwright, expect

    artifacts = Path(os.environ.get("CONTROLPLANE_TEST_ARTIFACTS") or tmp_path) / "console"
    artifacts.mkdir(parents=True, exist_ok=True)
    base = str(app_client.make_url("")).rstrip("/")
    task_id, resource = "release-sso-7", {"app": "web", "version": "7.0.0"}
    running = None
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = await (await chromium.new_context(viewport={"width": 1100, "height": 900})
                          ).new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))

            async def at_provider() -> None:
                """The provider's own login form, as the person fills it in."""
                try:
                    await page.locator('input[name="login"]').wait_for(timeout=10_000)
                except Exception:
                    raise AssertionError((page.url, await page.content())) from None
                await page.locator('input[name="login"]').fill("rita")
                await page.locator('input[name="password"]').fill("any-password")
                await page.get_by_role("button", name="Sign-in").click()

            await page.goto(base + "/console/")
            await page.get_by_role("link", name="Sign in with Test IdP").click()
            await at_provider()
            await expect(page.get_by_role("heading", name="Inbox")).to_be_visible()
            await expect(page.locator("header .who")).to_have_text(RITA)

            # alice starts the production run; her cpctl requests the ticket and waits.
            running = await asyncio.to_thread(
                start_cpctl, base, tmp_path / "home", "alice", "installer", "run", "--task-id",
                task_id, "--env", "prod", "--resource", json.dumps(resource),
                "--reason", "release 7.0.0 (CHG-7)",
                "--otp", totp.code_at(TOTP_SECRETS["alice"], time.time()))

            # rita's open inbox shows it (her role comes from her IdP group).
            row = page.locator("#inbox li[data-ticket]")
            await expect(row).to_be_visible(timeout=PROCESS_TIMEOUT_S * 1000)
            ticket_id = await row.get_attribute("data-ticket")
            assert ticket_id
            await page.screenshot(path=str(artifacts / "sso-inbox.png"), full_page=True)
            await row.get_by_role("link").click()
            await expect(page.locator("#state")).to_have_text("pending")
            await expect(page.locator("#reviewers")).to_contain_text(RITA)

            # Step up at the provider: a fresh login there, back on the ticket.
            await page.get_by_role("link", name="Confirm at the sign-in provider").click()
            await at_provider()
            await expect(page.locator("#state")).to_have_text("pending")
            assert page.url == f"{base}/console/tickets/{ticket_id}", page.url
            await expect(page.get_by_role("link", name="Confirm at the sign-in provider")
                         ).to_have_count(0)
            await page.get_by_label("Reason").fill("CHG-7 approved")
            await page.get_by_role("button", name="Approve").click()
            await expect(page.locator("#state")).to_have_text(re.compile(r"approved|consumed"))
            await page.screenshot(path=str(artifacts / "sso-approved.png"), full_page=True)

            # alice's waiting cpctl runs with the ticket; the executor reports its steps.
            await asyncio.to_thread(execute, base, task_id, running)
            code, out, err = await asyncio.to_thread(finish, running)
            assert code == 0, (out, err)
            assert f"run accepted: task {task_id}, ticket {ticket_id} consumed" in out, out
            await expect(page.locator("#state")).to_have_text("consumed", timeout=10_000)
            assert errors == [], errors
        finally:
            if running is not None and running.poll() is None:
                running.kill()
                running.communicate()
            await chromium.close()
