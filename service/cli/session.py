"""``cpctl login | step-up | logout | whoami``: a session with the service, kept per server URL.

People log in with a password (a no-echo prompt, or ``--password-stdin`` for scripts) and step
up with a TOTP code; services and agents log in with ``--key``, which signs a short-lived
assertion locally (the private key never leaves the machine). The token goes into the
credentials file (see ``client.py``) and is printed only with ``--print-token``.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..clock import iso
from . import client as http
from . import sso
from .client import EXIT_OK, CredentialStore, UsageError, guarded

__all__ = ["DEFAULT_AUDIENCE", "key_assertion", "prompt_otp", "register", "run", "step_up_session"]

DEFAULT_AUDIENCE = "urn:controlplane:local"  # the service's default authn.issuer


def register(sub: Any) -> None:
    """Add ``login``, ``step-up``, ``logout`` and ``whoami`` to ``cpctl``'s subparsers."""
    conn = http.connection_parent()

    login_p = sub.add_parser("login", parents=[http.connection_parent(token=False)],
                             help="log in and store a token for the server")
    login_p.add_argument("subject", metavar="SUBJECT", nargs="?",
                         help="subject id, e.g. alice or ci-bot (not with --sso or --token-file)")
    how = login_p.add_mutually_exclusive_group()
    how.add_argument("--sso", action="store_true",
                     help="sign in through the organisation's OpenID provider (browser, loopback redirect)")
    how.add_argument("--token-file", metavar="PATH",
                     help="exchange a workload's OIDC token (CI job, pod) for a session; '-' reads "
                          "stdin (env CONTROLPLANE_TOKEN_FILE)")
    how.add_argument("--password-stdin", action="store_true",
                     help="read the password from the first line of stdin (no prompt)")
    how.add_argument("--key", type=Path, metavar="PEM",
                     help="Ed25519 private key (PKCS#8 PEM) of a service or agent: log in with an assertion")
    login_p.add_argument("--audience", default=DEFAULT_AUDIENCE,
                         help=f"the service's issuer, the assertion's audience (default {DEFAULT_AUDIENCE})")
    _sso_args(login_p)
    _print_token_arg(login_p)
    login_p.set_defaults(func=guarded(login))

    step_p = sub.add_parser("step-up", parents=[conn],
                            help="verify a one-time code; the stored token becomes a stepped-up one")
    step_p.add_argument("--otp", metavar="CODE", help="the 6-digit code (prompted for when absent)")
    step_p.add_argument("--sso", action="store_true",
                        help="re-authenticate at the OpenID provider instead of a one-time code")
    _sso_args(step_p)
    _print_token_arg(step_p)
    step_p.set_defaults(func=guarded(step_up))

    out_p = sub.add_parser("logout", parents=[conn], help="end the session and forget its token")
    out_p.set_defaults(func=guarded(logout))

    who_p = sub.add_parser("whoami", parents=[conn], help="show the principal the service sees")
    who_p.add_argument("--json", action="store_true", help="print the principal document as JSON")
    who_p.set_defaults(func=guarded(whoami))


def _sso_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--provider", metavar="NAME",
                        help="with --sso: the sign-in provider (needed when several are configured)")
    parser.add_argument("--no-browser", action="store_true",
                        help="with --sso: only print the URL to open (no browser is started)")
    if parser.prog.endswith("login"):
        parser.add_argument("--device", action="store_true",
                            help="with --sso: the device authorization grant (RFC 8628), for a "
                                 "terminal without a browser: open the printed URL anywhere")


def _print_token_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--print-token", action="store_true",
                        help="also print the access token on stdout (it is a credential: handle with care)")


def run(argv: Sequence[str]) -> int:
    """Run one of this module's commands: ``argv`` starts with the command (``login ...``)."""
    parser = argparse.ArgumentParser(prog="cpctl")
    register(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(args.func(args))


# -- handlers ----------------------------------------------------------------------------------


def login(args: argparse.Namespace) -> int:
    url = http.server_url(args.server)
    token_file = http.workload_token_file(args.token_file)
    if args.sso or token_file is not None:
        return _federated_login(args, url, token_file)
    if not args.subject:
        raise UsageError("SUBJECT is required (or --sso, or --token-file)")
    if args.device:
        raise UsageError("--device goes with --sso")
    body: dict[str, Any]
    if args.key is not None:
        body = {"assertion": key_assertion(args.key, args.subject, args.audience)}
    else:
        body = {"subject_id": args.subject, "password": _password(args.subject, args.password_stdin)}
    answer = http.Client(url).post("/api/v1/authn/sessions", body, auth=False)
    _need_token(answer)
    CredentialStore().put(url, http.token_entry(answer, args.subject))
    _message(args, f"logged in to {url} as {args.subject} "
                   f"(session {answer.get('session_id')}, token valid {answer.get('expires_in')} s)")
    if args.print_token:
        print(answer["access_token"])
    return EXIT_OK


def step_up(args: argparse.Namespace) -> int:
    api = http.client_for(args)
    if args.sso:
        provider = sso.choose_provider(api, args.provider)
        answer = adopt_step_up(
            api, sso.sso_flow(api, provider, step_up=True, open_browser=not args.no_browser))
    else:
        code = args.otp if args.otp is not None else prompt_otp()
        answer = step_up_session(api, code)
    if api.from_store:
        _message(args, f"stepped up on {api.base_url} (token valid {answer.get('expires_in')} s)")
    elif not args.print_token:
        # The old token came from --token / CONTROLPLANE_TOKEN; the new one has nowhere to go.
        _message(args, "stepped up; the new token was not stored (the token came from --token or "
                       "CONTROLPLANE_TOKEN): use --print-token to get it")
    if args.print_token:
        print(answer["access_token"])
    return EXIT_OK


def step_up_session(api: http.Client, code: str) -> dict[str, Any]:
    """Step ``api``'s session up with a one-time code (``adopt_step_up``). The server's answer."""
    return adopt_step_up(api, api.post("/api/v1/authn/step-up", {"otp": code}))


def adopt_step_up(api: http.Client, answer: Any) -> dict[str, Any]:
    """Take a step-up answer (one-time code or IdP re-authentication): ``api`` uses the new token
    from then on, and the credentials file keeps it when the old one came from there."""
    _need_token(answer)
    if api.from_store:
        # The new renewal credential is a stepped one: renewals keep the step-up (its age
        # still counts from this step-up, never from a renewal).
        store = CredentialStore()
        previous = store.get(api.base_url) or {}
        entry = {**previous, **http.token_entry(answer, previous.get("subject_id"))}
        store.put(api.base_url, entry)
        api.adopt_entry(entry)
    api.token = answer["access_token"]
    return dict(answer)


def _federated_login(args: argparse.Namespace, url: str, token_file: str | None) -> int:
    if args.subject:
        raise UsageError("SUBJECT comes from the identity provider with --sso and --token-file")
    if args.device and not args.sso:
        raise UsageError("--device goes with --sso")
    api = http.Client(url)
    if token_file is not None:
        answer, how = sso.exchange_token_file(api, token_file), "a workload token"
    else:
        provider = sso.choose_provider(api, args.provider)
        if args.device:
            answer = sso.device_flow(api, provider)
        else:
            answer = sso.sso_flow(api, provider, open_browser=not args.no_browser)
        how = f"single sign-on ({provider})"
    _need_token(answer)
    principal = http.Client(url, answer["access_token"]).get("/api/v1/authn/sessions/current")
    subject = principal.get("subject_id") if isinstance(principal, dict) else None
    entry = http.token_entry(answer, subject)
    if isinstance(principal, dict) and isinstance(principal.get("authn_method"), str):
        # How this session steps up: hints name `cpctl step-up --sso` for an OIDC one.
        entry["authn_method"] = principal["authn_method"]
    CredentialStore().put(url, entry)
    _message(args, f"logged in to {url} as {subject} through {how} "
                   f"(session {answer.get('session_id')}, token valid {answer.get('expires_in')} s)")
    if args.print_token:
        print(answer["access_token"])
    return EXIT_OK


def logout(args: argparse.Namespace) -> int:
    api = http.client_for(args)
    try:
        api.delete("/api/v1/authn/sessions/current")
    except http.ClientError as exc:
        # A token that is already dead (expired, revoked) still has to leave the file.
        if exc.status != 401 or not api.from_store:
            raise
        CredentialStore().forget(api.base_url)
        print(f"the session had already ended ({exc.code}); forgot its token for {api.base_url}",
              file=sys.stderr)
        return EXIT_OK
    if api.from_store:
        CredentialStore().forget(api.base_url)
    print(f"logged out of {api.base_url}", file=sys.stderr)
    return EXIT_OK


def whoami(args: argparse.Namespace) -> int:
    api = http.client_for(args)
    principal = api.get("/api/v1/authn/sessions/current")
    if args.json:
        print(json.dumps(principal, indent=2, sort_keys=True))
        return EXIT_OK
    if not isinstance(principal, dict):
        raise UsageError("the server answered with an unexpected principal document")
    step = principal.get("step_up") or {}
    if step.get("verified"):
        age = step.get("age_s")
        step_text = "verified" + (f" {age:.0f} s ago" if isinstance(age, (int, float)) else "")
    else:
        step_text = "not verified"
    lines = [
        f"subject:    {principal.get('subject_id')} ({principal.get('kind')})",
        f"server:     {api.base_url}",
        f"session:    {principal.get('session_id')}",
        f"method:     {principal.get('authn_method')}, at {_iso(principal.get('auth_time'))}",
        f"step-up:    {step_text}",
        f"roles:      {_names(principal.get('roles'))}",
        f"groups:     {_names(principal.get('groups'))}",
    ]
    if principal.get("authn_method") == "oidc":
        # The IdP groups of the sign-in, which policy data binds to roles (shown above).
        lines.append(f"idp groups: {_names(principal.get('idp_groups'))}")
    print("\n".join(lines))
    return EXIT_OK


# -- helpers -----------------------------------------------------------------------------------


def _message(args: argparse.Namespace, text: str) -> None:
    # With --print-token stdout carries only the token, so `TOKEN=$(cpctl login ...)` works.
    print(text, file=sys.stderr if args.print_token else sys.stdout)


def _need_token(answer: Any) -> None:
    if not isinstance(answer, dict) or not isinstance(answer.get("access_token"), str):
        raise UsageError("the server answered without an access token")


def _password(subject: str, from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        password = getpass.getpass(f"Password for {subject}: ")
    else:
        # getpass would fall back to echoing stdin; say what to do instead.
        raise UsageError("no terminal to prompt for a password; use --password-stdin")
    if not password:
        raise UsageError("empty password")
    return password


def prompt_otp() -> str:
    """A one-time code from the terminal (no echo), or the first line of stdin without one."""
    if sys.stdin.isatty():
        code = getpass.getpass("One-time code: ")
    else:
        code = sys.stdin.readline()
    code = code.strip()
    if not code:
        raise UsageError("no one-time code given (use --otp CODE or type it at the prompt)")
    return code


def key_assertion(path: Path, subject: str, audience: str) -> str:
    """A signed login assertion of ``subject`` with the Ed25519 key at ``path`` (what `cpctl
    login SUBJECT --key PEM` sends; executors and scripts use it too)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ..authn.assertions import make_assertion

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, TypeError):
        raise UsageError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UsageError(f"{path} is not an Ed25519 private key")
    return make_assertion(key, subject_id=subject, audience=audience, now=time.time())


def _names(value: Any) -> str:
    names = [str(v) for v in value] if isinstance(value, list) else []
    return ", ".join(names) if names else "none"


def _iso(value: Any) -> str:
    """The server's ``auth_time`` (Unix seconds) as the one time format; anything else as is."""
    return iso(value) if isinstance(value, (int, float)) else str(value)
