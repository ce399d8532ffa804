"""End to end in a real headless Chromium (Debian's ``chromium``, driven by Playwright), with
the requester's real ``cpctl``: bob keeps his console inbox open; alice starts
``cpctl installer run`` for production with the command it will run, which requests the
ticket through the API (command included) and waits; bob's inbox shows it live with the
command; bob approves with an inline TOTP step-up; alice's waiting cpctl then runs with the
ticket and prints the task's step events as the executor reports them; the ticket page shows
the consumption. Screenshots of the inbox and ticket pages are written to
``$CONTROLPLANE_TEST_ARTIFACTS`` (else the test's tmp dir).

Without a browser (or the Playwright package) the test skips with the reason; under
``CI=true`` it fails instead (``.ci/run`` installs chromium).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.authn import totp
from service.cli.client import Client, CredentialStore, token_entry
from service.notifications.envelope import console_url
from service.tasks.tasks import INTENT_KIND
from tests.auth import PASSWORDS, TOTP_SECRETS, assertion
from tests.cpctl import PROCESS_TIMEOUT_S, finish, report_steps
from tests.servers import REPO, serve, wait_ready

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


def start_cpctl(base: str, home: Path, subject: str, *argv: str) -> subprocess.Popen[str]:
    """A real ``cpctl`` process as ``subject`` (logged in: its credentials file holds a token,
    as ``cpctl login`` leaves it; that command has its own tests)."""
    answer = Client(base).post("/api/v1/authn/sessions",
                               {"subject_id": subject, "password": PASSWORDS[subject]}, auth=False)
    credentials = home / subject / "credentials.json"
    CredentialStore(credentials).put(base, token_entry(answer, subject))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update({"CONTROLPLANE_URL": base, "CONTROLPLANE_CREDENTIALS": str(credentials),
                "PYTHONUNBUFFERED": "1"})
    return subprocess.Popen([sys.executable, "-m", "service", *argv], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def execute(base: str, task_id: str, running: subprocess.Popen[str]) -> None:
    """The executor (ci-bot) picks the accepted run up and reports its steps."""
    executor = Client(base)
    executor.token = executor.post("/api/v1/authn/sessions", {"assertion": assertion("ci-bot")},
                                   auth=False)["access_token"]
    report_steps(executor, task_id, running, ({"kind": "started", "message": "helm upgrade"},
                                              {"kind": "succeeded", "result": {"revision": 7}}))


async def test_request_review_in_the_browser_and_run(tmp_path, browser_required, artifacts):
    from playwright.async_api import async_playwright, expect

    command = "helm upgrade web ./chart --set image.tag=1.2.3"
    resource, task_id = {"app": "web", "version": "1.2.3"}, "release-42"
    running: subprocess.Popen[str] | None = None
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

                # alice starts the production run with its command: cpctl steps up, requests
                # the ticket through the API (command included) and waits for the approval.
                running = start_cpctl(
                    base, tmp_path / "home", "alice", "installer", "run", "--task-id", task_id,
                    "--env", "prod", "--resource", json.dumps(resource), "--command", command,
                    "--reason", "release 1.2.3 (CHG-42)",
                    "--otp", totp.code_at(TOTP_SECRETS["alice"], time.time()))

                # It shows up in bob's open inbox without a reload, with the command.
                row = page.locator("#inbox li[data-ticket]")
                await expect(row).to_be_visible(timeout=PROCESS_TIMEOUT_S * 1000)
                ticket_id = await row.get_attribute("data-ticket")
                assert ticket_id
                await expect(page.locator("#inbox-status")).to_have_text(
                    "Inbox updated: 1 to review")  # announced to screen readers
                await expect(row.locator("pre.command")).to_have_text(command)
                await expect(row.locator("time.countdown")).to_contain_text("review by in")
                await page.screenshot(path=str(artifacts / "inbox.png"), full_page=True)
                assert running.poll() is None, running.communicate()  # still waiting

                # bob opens it (the link messages carry) and approves; the prod ticket asks
                # for his one-time code inline.
                await row.get_by_role("link").click()
                await expect(page.locator("#state")).to_have_text("pending")
                assert page.url == console_url(base, ticket_id)
                await expect(page.locator("pre.command")).to_have_text(command)
                await page.get_by_label("Reason").fill("change CHG-42 approved")
                await page.get_by_label("One-time code (step-up)").fill(
                    totp.code_at(TOTP_SECRETS["bob"], time.time()))
                await page.screenshot(path=str(artifacts / "review.png"))
                assert running.poll() is None, running.communicate()  # started before, waiting
                await page.get_by_role("button", name="Approve").click()
                # Approved; alice's waiting cpctl may already have presented it (consumed).
                await expect(page.locator("#state")).to_have_text(re.compile(r"approved|consumed"))
                await expect(page.locator("#quorum")).to_have_text("1 of 1")

                # alice's waiting cpctl runs with the ticket; it prints each step event as the
                # executor reports it, and ends with the task.
                await asyncio.to_thread(execute, base, task_id, running)
                code, out, err = await asyncio.to_thread(finish, running)
                assert code == 0, (out, err)
                assert f"ticket {ticket_id} requested; waiting for reviewers" in err
                assert f"ticket {ticket_id} approved; running" in err
                lines = out.splitlines()
                assert f"run accepted: task {task_id}, ticket {ticket_id} consumed" in lines
                steps = [line.split()[2] for line in lines if line.startswith("#")]
                assert steps == [INTENT_KIND, "started", "succeeded"], out
                assert "helm upgrade" in out and lines[-1].startswith(f"task {task_id} succeeded")

                # The open ticket page shows the consumption by itself (live, no reload).
                await expect(page.locator("#state")).to_have_text("consumed", timeout=10_000)
                await expect(page.locator("#timeline")).to_contain_text(
                    "consumed by installer.run.execute")
                await expect(page.locator("pre.command")).to_have_text(command)
                await page.screenshot(path=str(artifacts / "ticket.png"), full_page=True)

                # Readable on a phone: nothing wider than the screen.
                await page.set_viewport_size({"width": 390, "height": 844})
                for path in ("/console/", f"/console/tickets/{ticket_id}", "/console/requests"):
                    await page.goto(base + path)
                    overflow = await page.evaluate(
                        "document.documentElement.scrollWidth - window.innerWidth")
                    assert overflow <= 0, (path, overflow)
                await page.screenshot(path=str(artifacts / "requests-phone.png"), full_page=True)
                assert errors == [], errors
            finally:
                if running is not None and running.poll() is None:
                    running.kill()
                    running.communicate()
                await browser.close()
    assert (artifacts / "inbox.png").stat().st_size > 0
    assert (artifacts / "ticket.png").stat().st_size > 0
