"""Two pending tickets are told apart by what they are for: the resource summary
(``app=payments version=2.4.0``) in the ticket's wire form, the console, notifications and
``cpctl approval list``."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from service.approvals.summary import SUMMARY_CHARS, resource_summary
from service.notifications.envelope import slack_message
from service.store.base import OutboxEvent
from tests.auth import REPO, bearer, login
from tests.console.console import Visitor

PAYMENTS = {"version": "2.4.0", "app": "payments", "notes": {"ticket": "CHG-1"}}
WEB = {"app": "web", "version": "3.0.0"}


def test_the_summary_names_the_app_and_version_first_on_one_bounded_line():
    assert resource_summary(PAYMENTS) == 'app=payments version=2.4.0 notes={"ticket":"CHG-1"}'
    assert resource_summary("web@3.0.0") == "web@3.0.0"
    assert resource_summary({"app": "a\nb", "x": "y" * 500}) .count("\n") == 0
    assert len(resource_summary({f"k{i}": "v" * 30 for i in range(20)})) == SUMMARY_CHARS
    assert resource_summary({"collection": "approvals"}) == "collection=approvals"


async def test_two_pending_tickets_are_told_apart_by_their_resource(client):
    alice, bob = await login(client, "alice"), await login(client, "bob")
    ids = {}
    for name, resource in (("payments", PAYMENTS), ("web", WEB)):
        created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
            "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
            "resource": resource, "reason": "release"})
        assert created.status == 201, await created.text()
        ids[name] = (await created.json())["id"]

    page = await (await client.get("/api/v1/approvals?state=pending",
                                   headers=bearer(bob))).json()
    summaries = {t["id"]: t["resource_summary"] for t in page["items"]}
    assert summaries[ids["payments"]].startswith("app=payments version=2.4.0")
    assert summaries[ids["web"]] == "app=web version=3.0.0"

    # The console: each card's title, and the ticket page's title.
    visitor = Visitor(client)
    try:
        assert (await visitor.sign_in("bob")).status == 303
        inbox = await visitor.page("/console/")
        for name in ("payments", "web"):
            card = inbox[inbox.index(f'data-ticket="{ids[name]}"'):]
            title = card[: card.index("</a>")]
            assert f"app={name} version=" in title
        ticket = await visitor.page(f"/console/tickets/{ids['web']}")
        assert "<title>Ticket " in ticket and "app=web version=3.0.0 · controlplane" in ticket
    finally:
        await visitor.close()

    # cpctl approval list: the resource column holds the summary.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service", "approval", "list", "--state", "pending",
        "--server", str(client.make_url("")).rstrip("/"), "--token", bob, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    rows = {line.split()[0]: line for line in out.decode().splitlines()[1:] if line.strip()}
    assert "app=payments version=2.4.0" in rows[ids["payments"]]
    assert "app=web version=3.0.0" in rows[ids["web"]]


def test_a_notification_names_the_resource_in_its_title():
    event = OutboxEvent(id="e1", ticket_id="tkt_" + "0" * 32, type="approval.requested",
                        env="prod", at=0.0, data={
                            "action": "installer.run.execute", "env": "prod",
                            "requested_by": "alice", "subject_id": "alice", "resource": PAYMENTS})
    message = json.loads(slack_message(event, dict(event.data)))
    assert "app=payments version=2.4.0" in message["text"]
    assert "app=payments version=2.4.0" in message["blocks"][0]["text"]["text"]
