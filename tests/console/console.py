"""Signing in to the console over HTTP as a browser would (form, cookies), for console tests."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aiohttp import ClientResponse, ClientSession, CookieJar
from aiohttp.test_utils import TestClient
from yarl import URL

from tests.auth import PASSWORDS, bearer, login

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
_REQUEST_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "approval-request.schema.json"
#: Whether tickets carry their command text yet (the ``command`` member of a ticket request);
#: until they do, tickets bind only its hash and the console says "no command bound".
COMMANDS = "command" in json.loads(_REQUEST_SCHEMA.read_text())["properties"]


class Visitor:
    """One person's browser: its own cookie jar against the app under test."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.base = client.make_url("")
        self.http = ClientSession(cookie_jar=CookieJar(unsafe=True))
        self.csrf = ""

    async def close(self) -> None:
        await self.http.close()

    def url(self, path: str) -> URL:
        return self.base.join(URL(path))

    async def get(self, path: str, **kwargs: Any) -> ClientResponse:
        return await self.http.get(self.url(path), allow_redirects=False, **kwargs)

    async def post(self, path: str, form: dict[str, str], **kwargs: Any) -> ClientResponse:
        return await self.http.post(self.url(path), data=form, allow_redirects=False, **kwargs)

    async def page(self, path: str) -> str:
        response = await self.get(path)
        assert response.status == 200, (response.status, await response.text())
        text = await response.text()
        found = CSRF.search(text)
        if found:
            self.csrf = found.group(1)
        return text

    async def sign_in(self, subject: str, password: str | None = None) -> ClientResponse:
        await self.page("/console/login")
        response = await self.post("/console/login", {
            "csrf": self.csrf, "subject_id": subject,
            "password": password if password is not None else PASSWORDS[subject],
            "next": "/console/"})
        if response.status == 303:
            await self.page("/console/")  # the session's CSRF token
        return response

    def cookie(self, name: str = "cp_console") -> str | None:
        for morsel in self.http.cookie_jar:
            if morsel.key == name:
                return morsel.value
        return None


async def token_of(client: TestClient, subject: str) -> str:
    """One API login per subject and client (password hashing is deliberately slow)."""
    tokens: dict[str, str] = client.__dict__.setdefault("console_tokens", {})
    if subject not in tokens:
        tokens[subject] = await login(client, subject)
    return tokens[subject]


async def request_ticket(client: TestClient, subject: str = "alice", *, env: str = "prod",
                         reason: str = "release 1.2.3", resource: Any = None,
                         command: Any = None) -> dict[str, Any]:
    """A ticket requested through the API (as the requester's CLI would)."""
    token = await token_of(client, subject)
    body: dict[str, Any] = {"subject_id": subject, "env": env, "action": "installer.run.execute",
                            "resource": resource if resource is not None else
                            {"app": "web", "version": "1.2.3"}, "reason": reason}
    if command is not None and COMMANDS:
        body["command"] = command
    response = await client.post("/api/v1/approvals", json=body, headers=bearer(token))
    assert response.status == 201, await response.text()
    return dict(await response.json())
