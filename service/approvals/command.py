"""The command a ticket binds: its canonical bytes, its hash, and the form approvers are shown.

A command is a string (the exact command line) or an argv array of strings. Canonical bytes:
a string's UTF-8, exactly as given (no trimming, no shell parsing: ``"helm upgrade  web"`` and
``"helm upgrade web"`` differ); an argv array's RFC 8785 (JCS) canonical JSON, so
``["helm", "upgrade"]`` and the string ``helm upgrade`` are different commands, no quoting
rule is involved, and any language with a JCS library computes the same bytes.

``command_hash`` is what tickets and the ``Command-Hash`` header carry: ``sha256:`` + the
lowercase hex SHA-256 of the canonical bytes. ``masked`` is what notifications show: the
shared log-masking rules (``logs.mask``), plus argv's ``--password VALUE`` form, where the
value is its own element.
"""

from __future__ import annotations

import hashlib
from typing import TypeAlias

from .. import canonical
from ..logs import MASK, mask
from ..redaction import is_secret_field

__all__ = ["Command", "canonical_command", "command_hash", "is_command", "masked"]

Command: TypeAlias = str | list[str]


def is_command(value: object) -> bool:
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
    """``command`` as notifications show it: secret-looking values replaced by ``***``.

    Strings go through the shared masking (``name=value`` pairs with a secret name, bearer
    credentials, JWTs, passwords in URLs). In an argv array an element that is a flag with a
    secret name and no ``=`` (``--password``, ``--api-key``) masks the element after it.
    """
    if isinstance(command, str):
        return str(mask(command))
    out: list[str] = []
    hide_next = False
    for arg in command:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        out.append(str(mask(arg)))
        if arg.startswith("-") and "=" not in arg and is_secret_field(arg.lstrip("-")):
            hide_next = True
    return out
