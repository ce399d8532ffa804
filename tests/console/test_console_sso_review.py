"""A person signed in through the organisation's OpenID provider reviews like anyone else: one
function (``approvals.policy.review_check``) decides who may review, for the API, the console's
inbox and ticket page, and the suggested reviewers of notifications and of the ticket page.

The real OpenID provider process (node-oidc-provider on loopback), as in test_console_sso.py:
rita's role comes from her IdP group ``approvers`` (``group_bindings`` in policy data), and she
is in the reviewer group production tickets need; sam has the same IdP group but is not."""

from __future__ import annotations

import re
import shutil
import time
import uuid
from html import unescape

import pytest

from service.app import create_app
from service.appkeys import AUTHENTICATOR, CONFIG, ENGINE, STORE
from service.notifications.reviewers import reviewers_of
from service.store.base import OutboxEvent
from tests.auth import bearer
from tests.authn.openid_provider import CLIENT_ID, CLIENT_SECRET, Browser, openid_provider, url
from tests.console.console import request_ticket
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
