"""``cpctl compose``: normalize compose files and check them against the compose preflight rules.

``check`` evaluates offline with the repository's ``policies/compose`` (the same ``evaluate()``
the endpoint runs) or, with ``--server``, POSTs the normalized fields to
``/api/v1/compose/import``. Exit codes (``EXIT_CODES``, also in ``check --help``): 0 passed,
1 not passed, 2 unusable input, 3 internal error; a crash is never 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from service.compose.normalize import NormalizeError, dotenv_path, normalize_files
from service.compose.preflight import (
    EVALUATION_BUDGET_S,
    POLICY_DIR,
    ComposeTooLarge,
    EvaluationBudgetExceeded,
    RuleSet,
    check_budget,
    evaluate,
)
from service.compose.render import render
from service.compose.source import (
    MAX_INTERPOLATED_CHARS,
    MAX_INTERPOLATION_DEPTH,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    read_dotenv,
)
from service.limits import JSONValueRefused, check_json
from service.schema_accept import accepts

__all__ = ["EXIT_CODES", "register", "run"]

SCHEMA = "compose-import.schema.json"
FORMATS = ("table", "json", "junit", "sarif")
#: The environment variable that, set to anything but "" or "0", prints the traceback of an
#: internal error (as ``--debug`` does).
DEBUG_ENV = "CONTROLPLANE_DEBUG"
#: The environment variable that, set to "0", compiles the rules every time (no bundle cache).
BUNDLE_CACHE_ENV = "CONTROLPLANE_BUNDLE_CACHE"

_UNUSABLE = f"""\
  2  unusable input, one line on stderr naming the file and where: unreadable,
     not UTF-8, not YAML, over {MAX_YAML_NODES:,} YAML nodes (an alias counts the size of
     what it refers to) or {MAX_YAML_DEPTH} levels of nesting, variable defaults nested over
     {MAX_INTERPOLATION_DEPTH} deep, variables expanding to over {MAX_INTERPOLATED_CHARS:,} \
characters, a missing
     required variable"""

_INTERNAL = f"""\
  3  internal error (a bug): one line on stderr; --debug or {DEBUG_ENV}=1
     prints the traceback"""

#: The exit-code contract of ``cpctl compose check`` (its ``--help`` epilog).
EXIT_CODES = f"""\
exit codes:
  0  passed (no failure; with --strict, no warning either)
  1  not passed: the report says why (a rule that could not be evaluated is an
     error cell, which fails)
{_UNUSABLE}; also: outside the request schema, over the size or
     time budget, and with --server a refusal by the server or a server that
     cannot be reached
{_INTERNAL}
A crash is never exit 1.
"""
_NORMALIZE_EXIT_CODES = f"""\
exit codes:
  0  the fields are printed
{_UNUSABLE}
{_INTERNAL}
"""


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``compose`` command group (``check``, ``normalize``) to ``subparsers``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "compose", help="Docker Compose preflight", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="compose_command", metavar="COMMAND", required=True)

    check = commands.add_parser("check", help="check compose files against the preflight rules",
                                description="Check compose files against the preflight rules.",
                                epilog=EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_file_args(check)
    check.add_argument("--strict", action="store_true", help="warnings also fail")
    check.add_argument("--env", help="target environment (rules may differ, e.g. prod)")
    check.add_argument("--format", choices=FORMATS, default="table")
    check.add_argument("--server", metavar="URL", help="evaluate on a control plane server")
    check.add_argument("--token", help="bearer token for --server (default: $CONTROLPLANE_TOKEN)")
    check.add_argument("--policies", type=Path, default=POLICY_DIR, help=argparse.SUPPRESS)
    check.add_argument("--budget", type=_seconds, default=EVALUATION_BUDGET_S, metavar="SECONDS",
                       help="stop an offline evaluation after this long (default: "
                            f"{EVALUATION_BUDGET_S:g}, the server's budget)")
    check.set_defaults(func=_guarded(_check))

    normalize = commands.add_parser("normalize", help="print the normalized fields as JSON",
                                    epilog=_NORMALIZE_EXIT_CODES,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_file_args(normalize)
    normalize.set_defaults(func=_guarded(_normalize))
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("between 0 and 3600 seconds")
    return value


def _add_file_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE",
                        help="compose files, merged in order like docker compose -f")
    parser.add_argument("--env-file", type=Path,
                        help="variables for interpolation (default: .env beside the first file)")
    parser.add_argument("--debug", action="store_true",
                        help=f"print the traceback of an internal error (also: {DEBUG_ENV}=1)")


def _guarded(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command`` under the exit-code contract: an unexpected exception is exit 3 with one
    line (the traceback only with ``--debug`` or ``CONTROLPLANE_DEBUG``), never a traceback
    read as exit 1."""

    def guarded(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except Exception as exc:
            err = _err(args)
            environ = getattr(args, "environ", None) or os.environ
            if getattr(args, "debug", False) or environ.get(DEBUG_ENV, "") not in ("", "0"):
                import traceback  # here: ~15 ms that only a failing run needs

                traceback.print_exception(exc, file=err)
                hint = "the traceback is above"
            else:
                hint = f"run again with --debug (or {DEBUG_ENV}=1) for the traceback"
            print(f"cpctl compose: internal error ({type(exc).__name__}): {hint}", file=err)
            return 3

    return guarded


def run(
    argv: Sequence[str],
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run ``cpctl compose ...`` arguments (without the leading ``compose``); for tests."""
    parser = argparse.ArgumentParser(prog="cpctl")
    register(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(["compose", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)
    args.stdout = stdout or sys.stdout
    args.stderr = stderr or sys.stderr
    args.environ = dict(os.environ if environ is None else environ)
    return int(args.func(args))


def _fields(args: argparse.Namespace) -> dict[str, Any] | None:
    environ = getattr(args, "environ", None)
    if environ is None:  # called through cli/main.py: this is the process edge
        environ = dict(os.environ)
    try:
        fields = normalize_files(args.files, environ=environ, env_file=args.env_file)
        # the endpoint's bounds on any JSON value (service.limits), as the body {"fields": ...}
        check_json(fields, "/fields", depth=2)
    except NormalizeError as exc:
        print(f"cpctl compose: {_one_line(str(exc))}", file=_err(args))
    except JSONValueRefused as exc:  # e.g. a variable from the shell that is not UTF-8
        print(f"cpctl compose: {exc.code}: {exc.pointer}: {exc.message}", file=_err(args))
    except RecursionError:  # the readers' bounds should make this unreachable: still input's
        print("cpctl compose: nested too deep to read", file=_err(args))
    else:
        return fields
    return None


def _dotenv(args: argparse.Namespace) -> dict[str, str] | None:
    """The variables of the ``.env`` beside the first file (or ``--env-file``), as the file
    sets them (the shell does not override them here): what secret-env judges as committed
    beside the compose file. ``_fields`` already read it, so it is readable."""
    path = dotenv_path(args.files, args.env_file)
    if path is None:
        return None
    try:
        return read_dotenv(path)
    except (NormalizeError, OSError):
        return None


def _one_line(text: str) -> str:
    """``text`` on one line (a message may quote a value that holds line breaks)."""
    return " ".join(text.split()) if "\n" in text or "\r" in text else text


def _out(args: argparse.Namespace) -> TextIO:
    return getattr(args, "stdout", None) or sys.stdout


def _err(args: argparse.Namespace) -> TextIO:
    return getattr(args, "stderr", None) or sys.stderr


def _normalize(args: argparse.Namespace) -> int:
    fields = _fields(args)
    if fields is None:
        return 2
    _out(args).write(json.dumps(fields, indent=2, ensure_ascii=False) + "\n")
    return 0


def _check(args: argparse.Namespace) -> int:
    fields = _fields(args)
    if fields is None:
        return 2
    body: dict[str, Any] = {"fields": fields, "strict": bool(args.strict)}
    if args.env:
        body["env"] = args.env
    # the same check the endpoint makes, before anything is sent; a body the import-light test
    # accepts is valid, anything else gets jsonschema's answer (and its messages)
    if not accepts(SCHEMA, body) and not _valid(body, _err(args)):
        return 2
    try:
        check_budget(fields)  # the endpoint's refusal, before anything is sent or evaluated
    except ComposeTooLarge as exc:
        print(f"cpctl compose: compose_too_large: {exc.message}", file=_err(args))
        return 2
    if args.server:
        report = _remote(args, body)
        if report is None:
            return 2
    else:
        rules = RuleSet.load(args.policies, bundle_cache=bundle_cache_dir(
            getattr(args, "environ", None) or os.environ))
        if not rules.rules:  # an empty rule set would pass anything: fail closed
            print(f"cpctl compose: no compose rules in {args.policies}: nothing would be checked",
                  file=_err(args))
            return 2
        try:
            report = evaluate(fields, strict=body["strict"], env=body.get("env"), rules=rules,
                              budget_s=args.budget, dotenv=_dotenv(args))
        except EvaluationBudgetExceeded as exc:
            print(f"cpctl compose: evaluation_budget_exceeded: {exc.message}", file=_err(args))
            return 2
    out = _out(args)
    environ = getattr(args, "environ", None) or os.environ
    color = args.format == "table" and _is_tty(out) and "NO_COLOR" not in environ
    dotenv = dotenv_path(args.files, args.env_file)
    out.write(render(report, args.format, files=[str(f) for f in args.files], color=color,
                     dotenv=str(dotenv) if dotenv is not None else None))
    return 0 if report["passed"] else 1


def _valid(body: dict[str, Any], err: TextIO) -> bool:
    """``body`` against the request schema with ``jsonschema`` (imported here: ~0.1-0.3 s), its
    violations on ``err``. The repository's schema: tests/compose/test_schema.py checks it
    against the metaschema, this process need not."""
    from service.schemas import ValidationFailed, validate

    try:
        validate(SCHEMA, body, check_schema=False)
    except ValidationFailed as exc:
        for violation in exc.violations:
            print(f"cpctl compose: {violation.pointer or '/'}: {violation.message}", file=err)
        return False
    return True


def bundle_cache_dir(environ: Mapping[str, str]) -> Path | None:
    """Where ``check`` keeps the compiled rules between runs (``service.rego``'s bundle cache:
    loading them costs ~5 ms, compiling ~0.1-0.2 s): ``$XDG_CACHE_HOME/controlplane/bundles``
    (default ``~/.cache``); ``None`` (compile every time) with ``CONTROLPLANE_BUNDLE_CACHE=0``
    or without a home directory."""
    if environ.get(BUNDLE_CACHE_ENV, "") == "0":
        return None
    base = environ.get("XDG_CACHE_HOME") or ""
    # XDG Base Directory: a relative value is invalid and must be ignored.
    if base and Path(base).is_absolute():
        return Path(base) / "controlplane" / "bundles"
    try:
        return Path.home() / ".cache" / "controlplane" / "bundles"
    except RuntimeError:  # no home directory to be found
        return None


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _remote(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any] | None:
    import urllib.error  # here: an offline check does not pay for http.client's import
    import urllib.request
    environ = getattr(args, "environ", None) or os.environ
    token = args.token or environ.get("CONTROLPLANE_TOKEN")
    url = args.server.rstrip("/") + "/api/v1/compose/import"
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if not url.startswith(("http://", "https://")):
        print(f"cpctl compose: --server must be an http(s) URL, got {args.server!r}",
              file=_err(args))
        return None
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")  # noqa: S310
    try:
        # The scheme is checked above: only http(s), never file: or custom handlers.
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            report: dict[str, Any] = json.load(response)
            return report
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:2000]
        print(f"cpctl compose: server answered {exc.code}: {detail}", file=_err(args))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"cpctl compose: cannot reach {url}: {exc}", file=_err(args))
    return None
