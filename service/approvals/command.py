"""The command a ticket binds: its canonical bytes, its hash, and the form approvers are shown.

A command is a string (the exact command line) or an argv array of strings. Canonical bytes:
a string's UTF-8, exactly as given (no trimming, no shell parsing: ``"helm upgrade  web"`` and
``"helm upgrade web"`` differ); an argv array's RFC 8785 (JCS) canonical JSON, so
``["helm", "upgrade"]`` and the string ``helm upgrade`` are different commands, no quoting
rule is involved, and any language with a JCS library computes the same bytes.

``command_hash`` is what tickets and the ``Command-Hash`` header carry: ``sha256:`` + the
lowercase hex SHA-256 of the canonical bytes. ``masked`` is the one form in which the service
keeps and shows a command (the ticket API, the console, notifications, ``cpctl approval show``):
secret values replaced by ``***``. The hash is taken over the exact command first, so the
binding is exact while no secret value is ever stored or shown.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import TypeAlias, TypeGuard

from .. import canonical
from ..logs import MASK, scrub
from ..redaction import is_secret_field

__all__ = ["Command", "canonical_command", "command_hash", "is_command", "masked"]

Command: TypeAlias = str | list[str]


def is_command(value: object) -> TypeGuard[Command]:
    """A string, or a non-empty list of strings."""
    if isinstance(value, str):
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def canonical_command(command: Command) -> bytes:
    """The bytes a command's hash is taken over; ``TypeError`` for anything but a string or a
    list of strings."""
    if isinstance(command, str):
        return command.encode("utf-8")
    if isinstance(command, list) and all(isinstance(arg, str) for arg in command):
        return canonical.dumps(command)
    raise TypeError("a command is a string or a list of strings")


def command_hash(command: Command) -> str:
    """``sha256:<lowercase hex>`` of the command's canonical bytes."""
    return "sha256:" + hashlib.sha256(canonical_command(command)).hexdigest()


def masked(command: Command) -> Command:
    """``command`` with its secret values replaced by ``***``; the rest as written.

    Argument by argument (an argv array's elements, a command line's shell words): an option
    or assignment whose name is secret (``service.redaction``) has its value masked, in both
    forms, ``--password=VALUE`` / ``DB_PASSWORD=VALUE`` and ``--password VALUE`` (the next
    argument), quoted or not; any other argument goes through the shared log masking
    (``logs.scrub``: passwords in URLs, bearer credentials, JWTs, ``name=value`` inside it, a
    command line inside it). A command line keeps its spacing and quoting except where a value
    was masked. Idempotent. Short options (``-p VALUE``) are not recognised: no name says
    they are secret.
    """
    if isinstance(command, str):
        return _masked_line(command)
    out: list[str] = []
    hide_next = False
    for arg in command:
        out.append(MASK if hide_next else _masked_arg(arg))
        hide_next = not hide_next and _is_secret_option(arg)
    return out


# A shell word: unquoted runs, '...' and "..." (an unterminated quote runs to the end), and
# backslash escapes, with nothing between them.
_SHELL_WORD = re.compile(r"""(?:[^\s'"\\]+|'[^']*'?|"(?:[^"\\]|\\.)*"?|\\.?)+""", re.DOTALL)
_SHELL_PART = re.compile(r"""'([^']*)'?|"((?:[^"\\]|\\.)*)"?|\\(.?)|([^'"\\]+)""", re.DOTALL)
_DQ_ESCAPE = re.compile(r'\\([\\"$`])')
# An assignment: an option's (``--name=value``) or an environment variable's (``NAME=value``).
_ASSIGNMENT = re.compile(r"(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)=(?P<value>.*)", re.DOTALL)


def _unquoted(word: str) -> str:
    """A shell word's value (quotes removed, escapes resolved)."""
    parts = []
    for single, double, escaped, bare in _SHELL_PART.findall(word):
        parts.append(single or _DQ_ESCAPE.sub(r"\1", double) or escaped or bare)
    return "".join(parts)


def _masked_line(line: str) -> str:
    out: list[str] = []
    end = 0
    hide_next = False
    for word in _SHELL_WORD.finditer(line):
        arg = _unquoted(word[0])
        shown = MASK if hide_next else _masked_arg(arg)
        hide_next = not hide_next and _is_secret_option(arg)
        out.append(line[end:word.start()])
        if shown == arg:
            out.append(word[0])  # unchanged: exactly as written
        elif shown == MASK or not _NEEDS_QUOTES.search(shown):
            out.append(shown)
        else:
            out.append(shlex.quote(shown))
        end = word.end()
    out.append(line[end:])
    return "".join(out)


_NEEDS_QUOTES = re.compile(r"[\s'\"\\]")


def _masked_arg(arg: str) -> str:
    assignment = _ASSIGNMENT.fullmatch(arg)
    if assignment is not None and is_secret_field(assignment["name"].lstrip("-")):
        return f"{assignment['name']}={MASK}"
    return scrub(arg)


def _is_secret_option(arg: str) -> bool:
    """``--password``, ``--api-key``: an option whose value is the next argument."""
    return arg.startswith("-") and "=" not in arg and is_secret_field(arg.lstrip("-"))
