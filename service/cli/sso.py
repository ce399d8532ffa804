"""Single sign-on from the command line (RFC 8252 loopback redirect) and workload token exchange.

``cpctl login --sso``: the CLI listens on an ephemeral ``127.0.0.1`` port, opens (or prints)
the service's sign-in URL carrying that loopback redirect and a PKCE S256 challenge, and waits.
The service runs the authorization-code flow with the IdP (its client secret never leaves the
server); when the browser comes back, the service redirects it to the CLI's port with a
one-time code, which only this CLI's PKCE verifier redeems for the token. ``cpctl step-up
--sso`` does the same for a fresh re-authentication at the IdP.

``cpctl login --sso --device`` uses the device authorization grant (RFC 8628) instead, for a
terminal without a browser: it prints the provider's URL and code and polls the service.

``cpctl login --token-file PATH``: a CI job or pod exchanges its own OIDC token (RFC 8693).
"""

from __future__ import annotations

import base64
import hashlib
import html
import secrets
import sys
import threading
import time
import webbrowser
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from . import client as http
from .client import UsageError

__all__ = ["device_flow", "exchange_token_file", "sso_flow"]

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:jwt"  # noqa: S105 - a token type URI
_MAX_TOKEN_FILE = 16384


class _Waiter:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.query: dict[str, str] = {}


def _handler(waiter: _Waiter) -> type[BaseHTTPRequestHandler]:
    class Callback(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path != "/callback" or waiter.done.is_set():
                self.send_error(404)
                return
            waiter.query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            ok = "code" in waiter.query
            text = ("Signed in: you can close this window and return to the terminal." if ok
                    else "Sign-in failed: see the terminal.")
            body = f"<!doctype html><title>cpctl</title><p>{html.escape(text)}</p>".encode()
            self.send_response(200 if ok else 400)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)
            waiter.done.set()

        def log_message(self, format: str, *args: Any) -> None:
            return  # the terminal shows our own messages only

    return Callback


def _pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def choose_provider(api: http.Client, name: str | None) -> str:
    listing = api.get("/api/v1/authn/oidc/providers")
    names = [p.get("name") for p in (listing or {}).get("providers", []) if isinstance(p, dict)]
    if name is not None:
        if name not in names:
            raise UsageError(f"no sign-in provider {name!r} on {api.base_url} "
                             f"(configured: {', '.join(map(str, names)) or 'none'})")
        return name
    if len(names) != 1:
        raise UsageError(f"{api.base_url} has {len(names)} sign-in providers; choose one with "
                         f"--provider ({', '.join(map(str, names)) or 'none configured'})")
    return str(names[0])


def sso_flow(
    api: http.Client,
    provider: str,
    *,
    step_up: bool = False,
    open_browser: bool = True,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Run the loopback flow; the token answer of the handoff (raises ``UsageError``)."""
    verifier, challenge = _pkce()
    waiter = _Waiter()
    server = HTTPServer(("127.0.0.1", 0), _handler(waiter))
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        params = {"cli_redirect": f"http://127.0.0.1:{port}/callback", "cli_challenge": challenge}
        if step_up:
            answer = api.request("POST", f"/api/v1/authn/oidc/{provider}/step-up", body={},
                                 query=params).body
            url = str(answer["authorization_url"])
        else:
            url = f"{api.base_url}/api/v1/authn/oidc/{provider}/login?{urlencode(params)}"
        print(f"Open this URL in a browser to sign in:\n{url}", file=sys.stderr, flush=True)
        if open_browser:
            try:
                webbrowser.open(url)
            except webbrowser.Error:
                pass  # the URL is printed
        if not waiter.done.wait(timeout_s):
            raise UsageError(f"no sign-in within {timeout_s:g} s")
    finally:
        server.shutdown()
        server.server_close()
    if "code" not in waiter.query:
        problem = waiter.query.get("error") or "no code"
        raise UsageError(f"the sign-in did not complete ({problem[:100]})")
    return dict(api.post("/api/v1/authn/oidc/handoff",
                         {"code": waiter.query["code"], "code_verifier": verifier}, auth=False))


def device_flow(api: http.Client, provider: str, *, timeout_s: float = 600.0) -> dict[str, Any]:
    """RFC 8628 through the service: show the code and URL, poll until approved or ended."""
    start = api.post(f"/api/v1/authn/oidc/{provider}/device", {}, auth=False)
    where = start.get("verification_uri_complete") or start["verification_uri"]
    print(f"On any device, open\n{where}\nand confirm the code {start['user_code']}",
          file=sys.stderr, flush=True)
    interval = float(start.get("interval") or 5)
    deadline = time.monotonic() + min(timeout_s, float(start.get("expires_in") or timeout_s))
    while time.monotonic() < deadline:
        time.sleep(interval)
        try:
            return dict(api.post(f"/api/v1/authn/oidc/{provider}/device/token",
                                 {"device_request": start["device_request"]}, auth=False))
        except http.ClientError as exc:
            if exc.code == "slow_down":
                interval += 5  # RFC 8628 §3.5
            elif exc.code != "authorization_pending":
                raise
    raise UsageError("the device sign-in was not approved in time")


def exchange_token_file(api: http.Client, path: str) -> dict[str, Any]:
    """RFC 8693: the service's token for the workload token in ``path`` (``-``: stdin)."""
    try:
        raw = sys.stdin.read(_MAX_TOKEN_FILE + 1) if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    token = raw.strip()
    if not token or len(token) > _MAX_TOKEN_FILE:
        raise UsageError(f"{path} does not hold a token")
    return dict(api.post_form("/api/v1/authn/token-exchange", {
        "grant_type": GRANT_TYPE, "subject_token": token, "subject_token_type": JWT_TOKEN_TYPE,
    }))
