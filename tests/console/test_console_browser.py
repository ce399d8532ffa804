"""End to end in a real headless Chromium (Debian's ``chromium``, driven by Playwright): alice
requests a production ticket with a command through the API; bob's inbox, already open, shows
it live with the command; bob approves with an inline TOTP step-up; alice's waiting run then
executes with the ticket; the ticket page shows the consumption. Screenshots of the inbox and
ticket pages are written to ``$CONTROLPLANE_TEST_ARTIFACTS`` (else the test's tmp dir).

Without a browser (or the Playwright package) the test skips with the reason; under
``CI=true`` it fails instead (``.ci/run`` installs chromium).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from service.authn import totp
from service.tasks.tasks import INTENT_KIND
from tests.auth import PASSWORDS, TOTP_SECRETS
from tests.console.console import COMMANDS
from tests.console.requester import ApiRequester
from tests.servers import serve, wait_ready

CHROMIUM = Path(os.environ.get("CONTROLPLANE_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage"]


def _unavailable() -> str | None:
    if not CHROMIUM.exists():
        return f"no browser at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture
def browser_required() -> None:
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    root = os.environ.get("CONTROLPLANE_TEST_ARTIFACTS")
    directory = Path(root) / "console" if root else tmp_path / "artifacts"
    directory.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots: {directory}")
    return directory


async def test_request_review_in_the_browser_and_run(tmp_path, browser_required, artifacts):
    from playwright.async_api import async_playwright, expect

    command = ["helm", "upgrade", "web", "./chart", "--set", "image.tag=1.2.3"]
    resource = {"app": "web", "version": "1.2.3"}
    with serve(tmp_path / "state") as (base, _proc):
        wait_ready(base + "/readyz")
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = await (await browser.new_context(viewport={"width": 1100, "height": 900})
                              ).new_page()
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                # bob signs in with the keyboard alone and keeps his inbox open.
                await page.goto(base + "/")
                await expect(page.get_by_label("User")).to_be_focused()
                await page.keyboard.type("bob")
                await page.keyboard.press("Tab")
                await expect(page.get_by_label("Password")).to_be_focused()
                await page.keyboard.type(PASSWORDS["bob"])
                await page.keyboard.press("Enter")
                await expect(page.get_by_role("heading", name="Inbox")).to_be_visible()
                await expect(page.locator("#inbox li.empty")).to_be_visible()
                await page.wait_for_timeout(300)  # the live stream is open

                # alice requests a production ticket with the command, through the API.
                alice = ApiRequester(base)
                body: dict[str, Any] = {"subject_id": "alice", "env": "prod",
                                        "action": "installer.run.execute", "resource": resource,
                                        "reason": "release 1.2.3 (CHG-42)"}
                if COMMANDS:
                    body["command"] = command
                ticket = await alice.request(body)
                action = {"task_id": "release-42", "action": "installer.run.execute",
                          "env": "prod", "resource": resource}
                run = asyncio.create_task(alice.run(ticket, action))  # waits for the approval

                # It shows up in bob's open inbox without a reload, with the command.
                row = page.locator(f'li[data-ticket="{ticket["id"]}"]')
                await expect(row).to_be_visible(timeout=10_000)
                await expect(page.locator("#inbox-status")).to_have_text(
                    "Inbox updated: 1 to review")  # announced to screen readers
                if COMMANDS:
                    await expect(row.locator("pre.command")).to_contain_text(
                        "helm upgrade web ./chart --set image.tag=1.2.3")
                await expect(row.locator("time.countdown")).to_contain_text("review by in")
                await page.screenshot(path=str(artifacts / "inbox.png"), full_page=True)

                # bob opens it and approves; the prod ticket asks for his one-time code inline.
                await row.get_by_role("link").click()
                await expect(page.locator("#state")).to_have_text("pending")
                await page.get_by_label("Reason").fill("change CHG-42 approved")
                await page.get_by_label("One-time code (step-up)").fill(
                    totp.code_at(TOTP_SECRETS["bob"], time.time()))
                await page.screenshot(path=str(artifacts / "review.png"))
                await page.get_by_role("button", name="Approve").click()
                await expect(page.locator("#state")).to_have_text("approved")
                await expect(page.locator("#quorum")).to_have_text("1 of 1")

                # alice's waiting run goes through with the ticket and gets its step event.
                events = await asyncio.wait_for(run, 30)
                assert [(e["kind"], e["env"]) for e in events] == [(INTENT_KIND, "prod")], events
                # The open ticket page shows the consumption by itself (live, no reload).
                await expect(page.locator("#state")).to_have_text("consumed", timeout=10_000)
                await expect(page.locator("#timeline")).to_contain_text(
                    "consumed by installer.run.execute")
                await page.screenshot(path=str(artifacts / "ticket.png"), full_page=True)

                # Readable on a phone: nothing wider than the screen.
                await page.set_viewport_size({"width": 390, "height": 844})
                for path in ("/console/", f"/console/tickets/{ticket['id']}", "/console/requests"):
                    await page.goto(base + path)
                    overflow = await page.evaluate(
                        "document.documentElement.scrollWidth - window.innerWidth")
                    assert overflow <= 0, (path, overflow)
                await page.screenshot(path=str(artifacts / "requests-phone.png"), full_page=True)
                assert errors == [], errors
            finally:
                await browser.close()
    assert (artifacts / "inbox.png").stat().st_size > 0
    assert (artifacts / "ticket.png").stat().st_size > 0
