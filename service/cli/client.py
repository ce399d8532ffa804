"""The ``cpctl`` HTTP client: server URL, stored credentials, JSON calls, one-line errors.

Synchronous on purpose (``urllib.request``): a command makes a handful of calls and exits.
Where things come from, strongest first:

- server: ``--server`` > ``CONTROLPLANE_URL`` > ``http://127.0.0.1:8700`` (``cpctl serve``'s default);
- token: ``--token`` > ``CONTROLPLANE_TOKEN`` > the credentials file entry for that server;
- credentials file: ``CONTROLPLANE_CREDENTIALS`` > ``$XDG_CONFIG_HOME/controlplane/credentials.json``
  > ``~/.config/controlplane/credentials.json``; directory 0700, file 0600, replaced atomically.

A person's stored session lasts a shift: access tokens live minutes, so a client whose token
came from the credentials file renews it (``POST /api/v1/authn/token/renew`` with the stored
``refresh_token``) shortly before it expires and once more on a ``401 token_expired``, and
keeps the new one in the file. A renewal refused (logged out, revoked, the session over)
is reported as such: log in again. ``--token`` / ``CONTROLPLANE_TOKEN`` are never renewed.

A problem+json answer becomes ``ClientError`` (exit 1), an unreachable server ``ConnectionFailed``
(exit 2); ``guarded`` turns both into one line on stderr, never a traceback. The CLI reads its own
``CONTROLPLANE_URL/TOKEN/CREDENTIALS`` variables here; the service's configuration never does.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import random
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
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
    "ServerEvent",
    "StreamInterrupted",
    "TicketNonces",
    "UsageError",
    "add_connection_args",
    "client_for",
    "connection_parent",
    "guarded",
    "report_error",
    "server_url",
    "signed_in_with_sso",
    "write_private",
]

DEFAULT_URL = "http://127.0.0.1:8700"
EXIT_OK, EXIT_ERROR, EXIT_UNAVAILABLE = 0, 1, 2
TIMEOUT_S = 30.0
#: A live stream silent this long is taken as dropped (servers send heartbeats every 15 s).
STREAM_READ_TIMEOUT_S = 60.0
#: The longest event line accepted from a stream (a ticket with a large resource fits).
MAX_EVENT_LINE = 4 * 1024 * 1024
#: Reopening a live stream: first pause, longest pause, and how long the server may keep
#: failing before ``Client.follow`` gives up.
RECONNECT_FIRST_S, RECONNECT_MAX_S, RECONNECT_GIVE_UP_S = 0.5, 15.0, 300.0
#: Answers after which a stream is worth reopening: too many streams, a gateway or a restart.
_TEMPORARY = frozenset({429, 502, 503, 504})
_MAX_DETAIL = 300
#: A stored token this close to its expiry is renewed before it is sent.
RENEW_AHEAD_S = 60.0
RENEW_PATH = "/api/v1/authn/token/renew"


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

    @property
    def reasons(self) -> list[str]:
        """The policy's or the server's reason codes, when the answer names any."""
        reasons = self.body.get("reasons")
        return [str(r) for r in reasons] if isinstance(reasons, list) else []

    def __str__(self) -> str:
        line = f"{self.status} {self.code}: {self.detail}"
        if self.reasons:
            line += " [reasons: " + ", ".join(self.reasons) + "]"
        if self.correlation_id:
            line += f" (correlation_id {self.correlation_id})"
        return line

    def as_json(self) -> dict[str, Any]:
        """The error as ``--json`` prints it: the server's problem document (when it sent one)
        with ``status``, ``code``, ``detail``, ``reasons`` and ``correlation_id`` always present."""
        doc = dict(self.body)
        doc.update({"status": self.status, "code": self.code,
                    "detail": str(doc.get("detail") or self.detail), "reasons": self.reasons,
                    "correlation_id": self.correlation_id})
        return {"error": doc}


class ConnectionFailed(Exception):
    """The server could not be reached at all (refused, unknown host, timeout, TLS)."""


class StreamInterrupted(ConnectionFailed):
    """A live stream stopped mid-way (connection dropped, nothing heard within the read
    timeout): reconnecting may help."""


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
    "approval_required": "the protected cpctl commands (`installer run`, `policy publish`, "
                         "`policy activate`, `policy rollback`) request, wait for and present "
                         "the ticket themselves; or `cpctl approval request ... --wait` with "
                         "the bindings above",
    "ticket_not_approved": "wait for the reviewers: `cpctl approval wait ID`",
    "too_many_streams": "other live streams of yours are open (waits, consoles); close one or "
                        "retry shortly",
    "outcome_unknown": "the store lost its answer, so the action may have run: check the ids "
                       "above (`cpctl approval show ID`) before repeating it; a ticket request "
                       "whose answer was lost is revoked by the service, so request again",
}


# For a person signed in through single sign-on (no one-time codes): the provider instead.
_SSO_HINTS = {
    "step_up_required": "run `cpctl step-up --sso` (sign in again at your provider) and try again",
    "insufficient_user_authentication": "run `cpctl step-up --sso` (sign in again at your "
                                        "provider) and try again",
    "unauthenticated": "run `cpctl login --sso` first",
    "invalid_token": "the token is no longer valid; run `cpctl login --sso`",
    "token_expired": "the session ended; run `cpctl login --sso`",
    "session_revoked": "the session was ended; run `cpctl login --sso`",
    "session_inactive": "the session is no longer active; run `cpctl login --sso`",
}


def signed_in_with_sso(server: str | None) -> bool:
    """Whether the stored session for ``server`` (``--server`` or its defaults) was opened
    through single sign-on (OIDC): such a person steps up at the provider, with no TOTP."""
    try:
        entry = CredentialStore().get(server_url(server))
    except UsageError:
        return False
    return entry is not None and entry.get("authn_method") == "oidc"


def _signed_in_with_sso(args: argparse.Namespace) -> bool:
    if getattr(args, "token", None) or os.environ.get("CONTROLPLANE_TOKEN"):
        return False  # not the stored session
    return signed_in_with_sso(getattr(args, "server", None))


def guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a command handler; report client errors as one stderr line and an exit code."""

    @functools.wraps(func)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return int(func(args) or EXIT_OK)
        except (ClientError, ConnectionFailed, UsageError) as exc:
            report_error(args, exc)
            return EXIT_UNAVAILABLE if isinstance(exc, ConnectionFailed) else EXIT_ERROR
        except BrokenPipeError:
            # `cpctl ... | head`: the reader is gone; that is not an error of ours.
            _silence_stdout()
            return EXIT_OK

    return wrapper


def report_error(args: argparse.Namespace, exc: ClientError | ConnectionFailed | UsageError) -> None:
    """One line on stderr (a server's error with its code, detail, reasons and correlation id)
    and a hint when there is one; with ``--json`` also the error document on stdout, for
    scripts (local errors as ``usage_error`` / ``unreachable`` with no correlation id)."""
    prog = _prog(args)
    if isinstance(exc, ClientError):
        print(f"{prog}: error: {exc}", file=sys.stderr)
        bindings = exc.body.get("bindings")
        if exc.code == "approval_required" and isinstance(bindings, dict):
            # What a ticket must be bound to, without --json: action, env and the resource.
            print(f"{prog}: needs a ticket for {bindings.get('action')} on "
                  f"{bindings.get('env')}, resource "
                  f"{json.dumps(bindings.get('resource'), sort_keys=True)}", file=sys.stderr)
        hint = (_SSO_HINTS.get(exc.code) if _signed_in_with_sso(args) else None) or _HINTS.get(
            exc.code)
        if hint:
            print(f"{prog}: hint: {hint}", file=sys.stderr)
        doc = exc.as_json()
    else:
        print(f"{prog}: {exc}", file=sys.stderr)
        code = "unreachable" if isinstance(exc, ConnectionFailed) else "usage_error"
        doc = {"error": {"code": code, "detail": str(exc), "reasons": [], "correlation_id": None}}
    if getattr(args, "json", False):
        json.dump(doc, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        sys.stdout.flush()


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
    from_store, entry = False, None
    if token is None:
        entry = CredentialStore().get(url)
        if entry is not None:
            token, from_store = entry.get("access_token"), True
    if need_token and not token:
        raise UsageError(f"not logged in to {url}; run `cpctl login SUBJECT` first")
    api = Client(url, token, from_store=from_store)
    if from_store and entry is not None:
        api.adopt_entry(entry)
    return api


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
        #: The stored session's renewal credential and the token's expiry (``adopt_entry``).
        self.refresh_token: str | None = None
        self.expires_at: float | None = None

    def adopt_entry(self, entry: Mapping[str, Any]) -> None:
        """Use a credentials-file entry: its token, renewal credential and expiry."""
        token, refresh = entry.get("access_token"), entry.get("refresh_token")
        self.token = token if isinstance(token, str) else self.token
        self.refresh_token = refresh if isinstance(refresh, str) else None
        expires = entry.get("expires_at")
        self.expires_at = float(expires) if isinstance(expires, (int, float)) else None

    def renew(self) -> bool:
        """Trade the renewal credential for a new access token of the same session (kept in
        the credentials file); False when there is none. A refused renewal raises its
        ``ClientError`` (``session_revoked``, ``session_inactive``...): log in again."""
        if self.refresh_token is None:
            return False
        answer = self.request("POST", RENEW_PATH, body={"refresh_token": self.refresh_token},
                              auth=False, renew=False).body
        if not isinstance(answer, dict) or not isinstance(answer.get("access_token"), str):
            raise ClientError(0, "bad_response", "the server renewed without an access token")
        store = CredentialStore()
        previous = store.get(self.base_url) or {}
        entry = {**previous, **token_entry(answer, previous.get("subject_id"))}
        entry.setdefault("refresh_token", self.refresh_token)
        if self.from_store:
            store.put(self.base_url, entry)
        self.adopt_entry(entry)
        return True

    def _renew_ahead(self) -> None:
        if (self.refresh_token is not None and self.expires_at is not None
                and self.expires_at - time.time() < RENEW_AHEAD_S):
            self.renew()

    def get(self, path: str, query: Mapping[str, Any] | None = None) -> Any:
        return self.request("GET", path, query=query).body

    def post(self, path: str, body: Any = None, *, auth: bool = True,
             headers: Mapping[str, str] | None = None) -> Any:
        return self.request("POST", path, body=body if body is not None else {}, auth=auth,
                            headers=headers).body

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
        headers: Mapping[str, str] | None = None,
        form: Mapping[str, str] | None = None,
        renew: bool = True,
    ) -> Response:
        if auth and renew:
            self._renew_ahead()
        try:
            return self._send(method, path, body=body, query=query, auth=auth, headers=headers,
                              form=form)
        except ClientError as exc:
            # The token expired in flight (or the clocks differ): renew once and send again.
            if not (auth and renew and exc.status == 401 and exc.code == "token_expired"
                    and self.renew()):
                raise
        return self._send(method, path, body=body, query=query, auth=auth, headers=headers,
                          form=form)

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any,
        query: Mapping[str, Any] | None,
        auth: bool,
        headers: Mapping[str, str] | None,
        form: Mapping[str, str] | None,
    ) -> Response:
        req = self._request(method, path, body=body, query=query, auth=auth, headers=headers,
                            form=form)
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

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        auth: bool = True,
        headers: Mapping[str, str] | None = None,
        accept: str = "application/json, application/problem+json",
        form: Mapping[str, str] | None = None,
    ) -> urllib.request.Request:
        url = self.base_url + path
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body).encode("utf-8")
        if form is not None:
            data = urllib.parse.urlencode(form).encode("ascii")
        req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 (http/https only)
        req.add_header("Accept", accept)
        if form is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        elif data is not None:
            req.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        if auth and self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        return req

    def follow(
        self,
        path: str,
        on_event: Callable[[ServerEvent], bool],
        *,
        last_event_id: str | None = None,
    ) -> None:
        """Feed the events of the live stream at ``path`` to ``on_event`` until it returns True.

        A stream that ends, drops, or is refused for a moment (429, 502-504: too many streams,
        a restart) is reopened after a pause with exponential backoff and jitter, resuming with
        the last event id seen; a pause is short again once a stream delivered an event. It
        gives up (raising the last error) once the server has failed for
        ``RECONNECT_GIVE_UP_S`` in a row; any other error answer is raised at once.
        """
        delay, failing_since = RECONNECT_FIRST_S, None
        while True:
            try:
                for event in self.events(path, last_event_id=last_event_id):
                    delay, failing_since = RECONNECT_FIRST_S, None
                    last_event_id = event.id or last_event_id
                    if on_event(event):
                        return
            except (ClientError, ConnectionFailed) as exc:
                if isinstance(exc, ClientError) and exc.status not in _TEMPORARY:
                    raise
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > RECONNECT_GIVE_UP_S:
                    raise
            # Jitter, so that clients cut off together do not come back in step.
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, RECONNECT_MAX_S)

    def events(
        self,
        path: str,
        *,
        last_event_id: str | None = None,
        read_timeout: float = STREAM_READ_TIMEOUT_S,
    ) -> Iterator[ServerEvent]:
        """The server-sent events of a live stream (WHATWG HTML, "server-sent events"), as they
        arrive, until the server closes it.

        An error answer before the stream starts raises ``ClientError``; a connection that
        drops, or stays silent longer than ``read_timeout`` (servers send heartbeats well
        within it), raises ``StreamInterrupted``; resuming is the caller's choice.
        """
        headers = {"Last-Event-ID": last_event_id} if last_event_id else None
        self._renew_ahead()
        req = self._request("GET", path, headers=headers, accept="text/event-stream")
        try:
            resp = _OPENER.open(req, timeout=read_timeout)
        except urllib.error.HTTPError as exc:
            error = _client_error(exc)
            if not (error.status == 401 and error.code == "token_expired" and self.renew()):
                raise error from None
            req = self._request("GET", path, headers=headers, accept="text/event-stream")
            try:
                resp = _OPENER.open(req, timeout=read_timeout)
            except urllib.error.HTTPError as again:
                raise _client_error(again) from None
            except OSError as again:
                raise ConnectionFailed(f"cannot reach {self.base_url}: {_reason(again)}") from None
        except urllib.error.URLError as exc:
            raise ConnectionFailed(f"cannot reach {self.base_url}: {_reason(exc.reason)}") from None
        except OSError as exc:
            raise ConnectionFailed(f"cannot reach {self.base_url}: {_reason(exc)}") from None
        with resp:
            media = (resp.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if media != "text/event-stream":
                raise ClientError(resp.status, "bad_response",
                                  f"expected an event stream, got {media or 'no content type'}")
            yield from _parse_events(resp, self.base_url)


@dataclass(frozen=True)
class ServerEvent:
    """One dispatched server-sent event."""

    event: str
    data: str
    id: str | None

    def json(self) -> Any:
        try:
            return json.loads(self.data)
        except ValueError:
            raise ClientError(0, "bad_response",
                              f"the server sent a {self.event!r} event that is not JSON") from None


def _parse_events(resp: Any, base_url: str) -> Iterator[ServerEvent]:
    """Dispatch events from the lines of ``resp`` (field parsing as the SSE spec has it)."""
    event, last_id = "", None
    data: list[str] = []
    while True:
        try:
            raw: bytes = resp.readline(MAX_EVENT_LINE + 1)
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            raise StreamInterrupted(f"the event stream from {base_url} stopped: "
                                    f"{_reason(exc) if isinstance(exc, OSError) else 'broken'}") from None
        if not raw:
            return  # the server closed the stream
        if len(raw) > MAX_EVENT_LINE:
            raise ClientError(0, "bad_response", "the server sent an event line over "
                              f"{MAX_EVENT_LINE} bytes")
        line = raw.decode("utf-8", "replace")
        line = line[:-1] if line.endswith("\n") else line
        line = line[:-1] if line.endswith("\r") else line
        if not line:
            if data:
                yield ServerEvent(event or "message", "\n".join(data), last_id)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue  # a comment: heartbeats
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id" and "\0" not in value:
            last_id = value


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
    "subject_id", "expires_at", "refresh_token"}}}`` (``refresh_token``: a person's renewal
    credential, as secret as the token). Every write replaces the file atomically (temp file in the
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
        write_private(self.path, doc)


def write_private(path: Path, doc: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``doc`` as JSON atomically, readable by its owner only."""
    directory = path.parent
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # mkstemp creates the file 0600, so a secret is never readable by others, even briefly.
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise UsageError(f"cannot write {path.name} in {directory}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class TicketNonces:
    """The nonces of tickets this user requested, per server URL, beside the credentials file
    (``tickets.json``, 0600): ``cpctl installer run`` presents them itself, so a nonce never
    passes through the user's clipboard. Entries leave once their ticket is used or settled
    without an approval, and after ``MAX_AGE_S`` (no ticket lives that long).
    """

    MAX_AGE_S = 8 * 86400  # longest pending time (7 days) + longest use-by time (1 day)

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or credentials_path().with_name("tickets.json")

    def _load(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"version": 1, "servers": {}}
        except OSError as exc:
            raise UsageError(f"cannot read {self.path}: {exc.strerror}") from None
        except ValueError:
            raise UsageError(f"{self.path} is not valid JSON; remove it") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("servers"), dict):
            raise UsageError(f"{self.path} has no 'servers' object; remove it")
        return doc

    def get(self, url: str, ticket_id: str) -> str | None:
        entry = self._load()["servers"].get(url, {}).get(ticket_id)
        nonce = entry.get("nonce") if isinstance(entry, dict) else None
        return nonce if isinstance(nonce, str) else None

    def put(self, url: str, ticket_id: str, nonce: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        doc = self._load()
        for tickets in doc["servers"].values():
            if isinstance(tickets, dict):
                for stale in [k for k, v in tickets.items()
                              if not isinstance(v, dict) or now - float(v.get("saved_at") or 0)
                              > self.MAX_AGE_S]:
                    del tickets[stale]
        doc["servers"].setdefault(url, {})[ticket_id] = {"nonce": nonce, "saved_at": now}
        write_private(self.path, doc)

    def forget(self, url: str, ticket_id: str) -> None:
        doc = self._load()
        if doc["servers"].get(url, {}).pop(ticket_id, None) is not None:
            write_private(self.path, doc)


def token_entry(body: Mapping[str, Any], subject_id: str | None, now: float | None = None) -> dict[str, Any]:
    """What the credentials file keeps from a 201 token answer."""
    issued = time.time() if now is None else now
    expires_in = body.get("expires_in")
    entry = {
        "access_token": body["access_token"],
        "token_type": body.get("token_type", "Bearer"),
        "session_id": body.get("session_id"),
        "subject_id": subject_id,
        "expires_at": issued + float(expires_in) if isinstance(expires_in, (int, float)) else None,
    }
    if isinstance(body.get("refresh_token"), str):
        # A person's renewal credential: the CLI renews its token with it (``Client.renew``).
        entry["refresh_token"] = body["refresh_token"]
    return entry
