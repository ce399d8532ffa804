"""The requester's side of the end-to-end test, over the API (as a CLI would do it).

Kept apart so the browser test can swap it for the real ``cpctl installer run`` once that exists:
``request`` asks for the ticket, ``run`` waits for the approval and presents ticket, nonce and
step-up itself, then returns the step events.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from service.authn import totp
from tests.auth import PASSWORDS, TOTP_SECRETS


@dataclass
class ApiRequester:
    base: str
    subject: str = "alice"
    token: str = ""

    async def _login(self, http: aiohttp.ClientSession) -> None:
        async with http.post(f"{self.base}/api/v1/authn/sessions", json={
                "subject_id": self.subject, "password": PASSWORDS[self.subject]}) as response:
            assert response.status == 201, await response.text()
            self.token = (await response.json())["access_token"]

    def _auth(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **extra}

    async def request(self, body: dict[str, Any]) -> dict[str, Any]:
        """Request a ticket; the 201 body (with the nonce, shown to the requester only)."""
        async with aiohttp.ClientSession() as http:
            await self._login(http)
            async with http.post(f"{self.base}/api/v1/approvals", json=body,
                                 headers=self._auth()) as response:
                assert response.status == 201, await response.text()
                return dict(await response.json())

    async def run(self, ticket: dict[str, Any], action: dict[str, Any], *, timeout: float = 60.0
                  ) -> list[dict[str, Any]]:
        """Wait until the ticket is approved, step up, run the action with the ticket, and
        return the task's step events."""
        async with aiohttp.ClientSession() as http:
            await self._login(http)
            deadline = time.monotonic() + timeout
            while True:
                async with http.get(f"{self.base}/api/v1/approvals/{ticket['id']}",
                                    headers=self._auth()) as response:
                    state = (await response.json())["state"]
                if state != "pending":
                    break
                assert time.monotonic() < deadline, "the ticket was never reviewed"
                await asyncio.sleep(0.2)
            assert state == "approved", state
            code = totp.code_at(TOTP_SECRETS[self.subject], time.time())
            async with http.post(f"{self.base}/api/v1/authn/step-up", json={"otp": code},
                                 headers=self._auth()) as response:
                assert response.status == 201, await response.text()
                self.token = (await response.json())["access_token"]
            headers = self._auth(**{"Approval-Ticket": ticket["id"], "Approval-Nonce": ticket["nonce"]})
            if ticket.get("command_hash"):
                headers["Command-Hash"] = ticket["command_hash"]
            async with http.post(f"{self.base}/api/v1/installer/actions", json=action,
                                 headers=headers) as response:
                assert response.status == 202, await response.text()
            async with http.get(f"{self.base}/api/v1/tasks/{action['task_id']}/events",
                                headers=self._auth()) as response:
                assert response.status == 200, await response.text()
                return list((await response.json())["items"])
