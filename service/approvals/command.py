"""The command a ticket binds: its canonical bytes, its hash, and the form approvers are shown.

A command is either a command line (a string) or an argv array (a list of strings):

- canonical bytes of a string: its UTF-8 encoding, exactly as given (no trimming, no shell
  parsing: ``"helm upgrade  web"`` and ``"helm upgrade web"`` are different commands);
- canonical bytes of an argv array: the RFC 8785 (JCS) JSON text of the array, so
  ``["helm", "upgrade", "web"]`` hashes the same in every language with a JCS library.

``command_hash`` is the lowercase hex SHA-256 of the canonical bytes; a ticket stores it as
``sha256:<hex>`` (``binding.command_hash``) and the chain compares the ``Command-Hash`` header
with it. ``masked`` is what notifications show: the shared log-masking rules
(``logs.mask``), plus argv's ``--password VALUE`` form, where the value is its own element.
"""

from __future__ import annotations

import hashlib
from typing import TypeAlias

import rfc8785

from ..logs import MASK, mask
from ..redaction import is_secret_field

__all__ = ["Command", "canonical", "command_hash", "is_command", "masked"]

Command: TypeAlias = str | list[str]


def is_command(value: object) -> bool:
    """A string, or a non-empty list of strings."""
    if isinstance(value, str):
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def canonical(command: Command) -> bytes:
    """The bytes the hash is taken over (see the module docstring)."""
    if isinstance(command, str):
        return command.encode("utf-8")
    if not is_command(command):
        raise TypeError("a command is a string or a non-empty list of strings")
    return rfc8785.dumps(list(command))


def command_hash(command: Command) -> str:
    """Lowercase hex SHA-256 of the canonical bytes of ``command``."""
    return hashlib.sha256(canonical(command)).hexdigest()


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
