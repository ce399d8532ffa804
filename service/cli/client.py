"""The ``cpctl`` HTTP client: server URL, stored credentials, JSON calls, one-line errors.

Synchronous on purpose (``urllib.request``): a command makes a handful of calls and exits.
Where things come from, strongest first:

- server: ``--server`` > ``CONTROLPLANE_URL`` > ``http://127.0.0.1:8700`` (``cpctl serve``'s default);
- token: ``--token`` > ``CONTROLPLANE_TOKEN`` > the credentials file entry for that server;
- credentials file: ``CONTROLPLANE_CREDENTIALS`` > ``$XDG_CONFIG_HOME/controlplane/credentials.json``
  > ``~/.config/controlplane/credentials.json``; directory 0700, file 0600, replaced atomically.

A problem+json answer becomes ``ClientError`` (exit 1), an unreachable server ``ConnectionFailed``
(exit 2); ``guarded`` turns both into one line on stderr, never a traceback. The CLI reads its own
``CONTROLPLANE_URL/TOKEN/CREDENTIALS`` variables here; the service's configuration never does.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_URL",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "Client",
    "ClientError",
    "ConnectionFailed",
    "CredentialStore",
    "UsageError",
    "add_connection_args",
    "client_for",
    "connection_parent",
    "guarded",
    "server_url",
]

DEFAULT_URL = "http://127.0.0.1:8700"
EXIT_OK, EXIT_ERROR, EXIT_UNAVAILABLE = 0, 1, 2
TIMEOUT_S = 30.0
_MAX_DETAIL = 300


class ClientError(Exception):
    """The server answered with an error (problem+json when it could)."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        correlation_id: str | None = None,
        *,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.correlation_id = correlation_id
        self.body: dict[str, Any] = dict(body or {})

    def __str__(self) -> str:
        line = f"{self.status} {self.code}: {self.detail}"
        if self.correlation_id:
            line += f" (correlation_id {self.correlation_id})"
        return line


class ConnectionFailed(Exception):
    """The server could not be reached at all (refused, unknown host, timeout, TLS)."""


class UsageError(Exception):
    """A local problem the user can fix: not logged in, an unreadable key, a bad URL (exit 1)."""


# Hints printed under an error, by problem code: what to run next.
_HINTS = {
    "step_up_required": "run `cpctl step-up` and try again",
    "insufficient_user_authentication": "run `cpctl step-up` and try again",
    "unauthenticated": "run `cpctl login SUBJECT` first",
    "invalid_token": "the token is no longer valid; run `cpctl login SUBJECT`",
    "token_expired": "the token expired; run `cpctl login SUBJECT`",
    "session_revoked": "the session was ended; run `cpctl login SUBJECT`",
    "session_inactive": "the session is no longer active; run `cpctl login SUBJECT`",
}


def guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a command handler; report client errors as one stderr line and an exit code."""

    @functools.wraps(func)
    def wrapper(args: argparse.Namespace) -> int:
        prog = _prog(args)
        try:
            return int(func(args) or EXIT_OK)
        except ClientError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            hint = _HINTS.get(exc.code)
            if hint:
                print(f"{prog}: hint: {hint}", file=sys.stderr)
            return EXIT_ERROR
        except ConnectionFailed as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        except UsageError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return EXIT_ERROR
        except BrokenPipeError:
            # `cpctl ... | head`: the reader is gone; that is not an error of ours.
            _silence_stdout()
            return EXIT_OK

    return wrapper


def _prog(args: argparse.Namespace) -> str:
    # "cpctl approval review": the top-level command, then any "<group>_command" subcommand.
    words = [getattr(args, "command", None)]
    words += [v for k, v in sorted(vars(args).items()) if k.endswith("_command") and isinstance(v, str)]
    return " ".join(["cpctl", *(w for w in words if w)])


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# -------------------------------------------------------------------------------- arguments


def add_connection_args(parser: argparse.ArgumentParser, *, token: bool = True) -> None:
    """``--server`` (and ``--token``, unless ``token=False``) on a command that talks to the service."""
    parser.add_argument(
        "--server", metavar="URL",
        help=f"service base URL (env CONTROLPLANE_URL; default {DEFAULT_URL})",
    )
    if not token:
        return
    parser.add_argument(
        "--token", help="bearer token to use instead of the stored one (env CONTROLPLANE_TOKEN)"
    )


def connection_parent(*, token: bool = True) -> argparse.ArgumentParser:
    """A parent parser carrying the connection options, for ``parents=[...]``."""
    parent = argparse.ArgumentParser(add_help=False)
    add_connection_args(parent, token=token)
    return parent


def server_url(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The normalised base URL: ``scheme://host[:port][/prefix]`` without a trailing slash."""
    env = os.environ if environ is None else environ
    raw = explicit or env.get("CONTROLPLANE_URL") or DEFAULT_URL
    parts = urllib.parse.urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"server URL must be http:// or https:// with a host, not {raw!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise UsageError("server URL must not carry credentials, a query or a fragment")
    return urllib.parse.urlunsplit(
        (parts.scheme, parts.netloc.lower(), parts.path.rstrip("/"), "", "")
    )


def client_for(args: argparse.Namespace, *, need_token: bool = True) -> Client:
    """A client for the command's ``--server``/``--token`` options (and their variables)."""
    url = server_url(getattr(args, "server", None))
    token = getattr(args, "token", None) or os.environ.get("CONTROLPLANE_TOKEN") or None
    from_store = False
    if token is None:
        entry = CredentialStore().get(url)
        if entry is not None:
            token, from_store = entry.get("access_token"), True
    if need_token and not token:
        raise UsageError(f"not logged in to {url}; run `cpctl login SUBJECT` first")
    return Client(url, token, from_store=from_store)


# ------------------------------------------------------------------------------------ client


@dataclass
class Response:
    status: int
    headers: Mapping[str, str]
    body: Any


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect would re-send the bearer token to wherever the server points; the API never
    # redirects, so one is treated as an error instead of being followed.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class Client:
    """JSON over HTTP to one service; raises ``ClientError`` / ``ConnectionFailed``."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = TIMEOUT_S,
        from_store: bool = False,
    ) -> None:
        self.base_url = base_url
        self.token = token
        self.timeout = timeout
        # True when the token came from the credentials file (not --token / CONTROLPLANE_TOKEN):
        # only then may a command replace or forget the stored entry.
        self.from_store = from_store

    def get(self, path: str, query: Mapping[str, Any] | None = None) -> Any:
        return self.request("GET", path, query=query).body

    def post(self, path: str, body: Any = None, *, auth: bool = True) -> Any:
        return self.request("POST", path, body=body if body is not None else {}, auth=auth).body

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path).body

    def post_form(self, path: str, form: Mapping[str, str]) -> Any:
        """POST ``application/x-www-form-urlencoded`` (OAuth endpoints), unauthenticated."""
        return self.request("POST", path, form=form, auth=False).body

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        auth: bool = True,
        form: Mapping[str, str] | None = None,
    ) -> Response:
        url = self.base_url + path
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body).encode("utf-8")
        if form is not None:
            data = urllib.parse.urlencode(form).encode("ascii")
        req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 (http/https only)
        req.add_header("Accept", "application/json, application/problem+json")
        if form is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        elif data is not None:
            req.add_header("Content-Type", "application/json")
        if auth and self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with _OPENER.open(req, timeout=self.timeout) as resp:
                return Response(resp.status, dict(resp.headers), _decode(resp.read()))
        except urllib.error.HTTPError as exc:
            raise _client_error(exc) from None
        except urllib.error.URLError as exc:
            raise ConnectionFailed(f"cannot reach {self.base_url}: {_reason(exc.reason)}") from None
        except TimeoutError:
            raise ConnectionFailed(
                f"cannot reach {self.base_url}: no answer within {self.timeout:g} s"
            ) from None
        except OSError as exc:
            raise ConnectionFailed(f"cannot reach {self.base_url}: {_reason(exc)}") from None


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise ClientError(0, "bad_response", "the server answered with something that is not JSON") from None


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (is `cpctl serve` running?)"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return str(reason)


def _client_error(exc: urllib.error.HTTPError) -> ClientError:
    """A ``ClientError`` from an HTTP error answer (problem+json, or anything else)."""
    headers = exc.headers
    try:
        raw = exc.read()
    except OSError:
        raw = b""
    correlation = headers.get("X-Correlation-ID") if headers else None
    doc: Any = None
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("code"), str):
        detail = str(doc.get("detail") or doc.get("title") or "")
        if doc.get("errors"):
            # Schema errors: name the JSON pointers, which say what to fix.
            pointers = [str(e.get("pointer") or "/") + " " + str(e.get("message", ""))
                        for e in doc["errors"] if isinstance(e, dict)]
            detail += " [" + "; ".join(pointers) + "]"
        return ClientError(exc.code, doc["code"], _one_line(detail),
                           doc.get("correlation_id") or correlation, body=doc)
    text = raw.decode("utf-8", "replace") if raw else (exc.reason or "")
    return ClientError(exc.code, f"http_{exc.code}", _one_line(str(text)) or "no detail",
                       correlation)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_DETAIL else line[: _MAX_DETAIL - 3] + "..."


# ------------------------------------------------------------------------------- credentials


def workload_token_file(explicit: str | None) -> str | None:
    """``--token-file``, else ``$CONTROLPLANE_TOKEN_FILE`` (a CI job's OIDC token file)."""
    return explicit or os.environ.get("CONTROLPLANE_TOKEN_FILE") or None


def credentials_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    explicit = env.get("CONTROLPLANE_CREDENTIALS")
    if explicit:
        return Path(explicit).expanduser()
    base = env.get("XDG_CONFIG_HOME") or ""
    # XDG Base Directory: a relative value is invalid and must be ignored.
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "controlplane" / "credentials.json"


class CredentialStore:
    """Tokens per server URL in one JSON file only its owner can read.

    Layout: ``{"version": 1, "servers": {URL: {"access_token", "token_type", "session_id",
    "subject_id", "expires_at"}}}``. Every write replaces the file atomically (temp file in the
    same directory, 0600 from creation, then ``os.replace``).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or credentials_path()

    def load(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"version": 1, "servers": {}}
        except OSError as exc:
            raise UsageError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            doc = json.loads(text)
        except ValueError:
            raise UsageError(f"{self.path} is not valid JSON; remove it and log in again") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("servers"), dict):
            raise UsageError(f"{self.path} has no 'servers' object; remove it and log in again")
        return doc

    def get(self, url: str) -> dict[str, Any] | None:
        entry = self.load()["servers"].get(url)
        return entry if isinstance(entry, dict) else None

    def put(self, url: str, entry: Mapping[str, Any]) -> None:
        doc = self.load()
        doc["servers"][url] = dict(entry)
        self._write(doc)

    def forget(self, url: str) -> bool:
        doc = self.load()
        if doc["servers"].pop(url, None) is None:
            return False
        self._write(doc)
        return True

    def _write(self, doc: Mapping[str, Any]) -> None:
        directory = self.path.parent
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            # mkstemp creates the file 0600, so the token is never readable by others, even briefly.
            fd, tmp = tempfile.mkstemp(prefix=".credentials-", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise UsageError(f"cannot write credentials in {directory}: {exc.strerror}") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=2, sort_keys=True)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def token_entry(body: Mapping[str, Any], subject_id: str | None, now: float | None = None) -> dict[str, Any]:
    """What the credentials file keeps from a 201 token answer."""
    issued = time.time() if now is None else now
    expires_in = body.get("expires_in")
    return {
        "access_token": body["access_token"],
        "token_type": body.get("token_type", "Bearer"),
        "session_id": body.get("session_id"),
        "subject_id": subject_id,
        "expires_at": issued + float(expires_in) if isinstance(expires_in, (int, float)) else None,
    }
