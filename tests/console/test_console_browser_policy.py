"""Issue 30 (2), end to end in headless Chromium: alice runs ``cpctl policy publish`` for a
production fleet from a working directory with its own ``policies/``; it requests the ticket and
waits. bob opens the ticket in the console and reads the change before approving: the signed
message, the vetting, the diff (its text), the impact; he approves with his one-time code and
alice's waiting ``cpctl`` publishes. Screenshots go to ``$CONTROLPLANE_TEST_ARTIFACTS`` (else the
test's tmp dir). Skips without a browser (fails under ``CI=true``), like the console's own."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from service.authn import totp
from service.authz.revisions import Bundle
from service.cli.client import Client, CredentialStore, token_entry
from tests.auth import PASSWORDS, TOTP_SECRETS
from tests.authz.revisions import fleet_keys
from tests.console.test_console_browser import (  # noqa: F401  (fixtures)
    CHROMIUM,
    CHROMIUM_ARGS,
    artifacts,
    browser_required,
)
from tests.cpctl import PROCESS_TIMEOUT_S, finish
from tests.servers import REPO, serve, wait_ready


def _start(cwd: Path, env: dict[str, str], *argv: str) -> subprocess.Popen[str]:
    """alice's real ``cpctl`` from her working directory."""
    return subprocess.Popen([sys.executable, "-m", "service", *argv], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


async def test_a_reviewer_reads_the_policy_diff_in_the_browser_and_approves(
        tmp_path: Path, browser_required: None, artifacts: Path) -> None:  # noqa: F811
    from playwright.async_api import async_playwright, expect

    keys, config = fleet_keys(tmp_path)
    work = tmp_path / "work"
    shutil.copytree(REPO / "policies", work / "policies")
    with (work / "policies" / "authz.rego").open("a") as f:
        f.write("\n# CHG-77: a reviewed line\n")
    revision = Bundle.from_dir(work / "policies").revision_id()

    running: subprocess.Popen[str] | None = None
    with serve(tmp_path / "state", env={"CONTROLPLANE_CONFIG": str(config)}) as (base, _proc):
        wait_ready(base + "/readyz")
        answer = Client(base).post("/api/v1/authn/sessions", {
            "subject_id": "alice", "password": PASSWORDS["alice"]}, auth=False)
        credentials = tmp_path / "alice" / "credentials.json"
        CredentialStore(credentials).put(base, token_entry(answer, "alice"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
        env.update({"CONTROLPLANE_URL": base, "CONTROLPLANE_CREDENTIALS": str(credentials),
                    "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)})
        running = _start(work, env, "policy", "publish", "--key", str(keys / "signer.pem"),
                         "-m", "CHG-77 tighten reads", "--otp",
                         totp.code_at(TOTP_SECRETS["alice"], time.time()))
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = await (await browser.new_context(viewport={"width": 1100, "height": 900})
                              ).new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                await page.goto(base + "/")
                await page.get_by_label("User").fill("bob")
                await page.get_by_label("Password").fill(PASSWORDS["bob"])
                await page.get_by_label("Password").press("Enter")
                row = page.locator("#inbox li[data-ticket]")
                await expect(row).to_be_visible(timeout=PROCESS_TIMEOUT_S * 1000)
                await row.get_by_role("link").click()
                await expect(page.locator("#state")).to_have_text("pending")

                change = page.locator("#policy-change")
                await expect(change).to_be_visible()
                await expect(change.locator(".message")).to_have_text("CHG-77 tighten reads")
                await expect(change.locator(".vetting")).to_contain_text("passed")
                await expect(change.locator(".diff-summary")).to_contain_text(
                    "1 files, +2 -0 lines")
                await expect(change.locator("pre.diff")).to_contain_text(
                    "+# CHG-77: a reviewed line")
                await expect(change).to_contain_text(revision)
                await page.screenshot(path=str(artifacts / "policy-change.png"), full_page=True)
                assert running.poll() is None, running.communicate()  # still waiting

                await page.get_by_label("Reason").fill("diff read, CHG-77")
                await page.get_by_label("One-time code (step-up)").fill(
                    totp.code_at(TOTP_SECRETS["bob"], time.time()))
                await page.get_by_role("button", name="Approve").click()
                code, out, err = await asyncio.to_thread(finish, running)
                assert code == 0, (out, err)
                assert f"published {revision}" in out
                assert f"policies: {work / 'policies'} (default ./policies)" in err

                await page.set_viewport_size({"width": 390, "height": 844})
                await page.reload()
                overflow = await page.evaluate(
                    "document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 0, overflow  # the diff stays readable on a phone
                assert errors == [], errors
            finally:
                if running is not None and running.poll() is None:
                    running.kill()
                    running.communicate()
                await browser.close()
    assert (artifacts / "policy-change.png").stat().st_size > 0
