"""The command a ticket binds: its canonical bytes and their hash.

A command is a string (the exact command line) or an argv array of strings. Canonical bytes:
a string's UTF-8; an argv array's RFC 8785 (JCS) canonical JSON, so ``["helm", "upgrade"]``
and the string ``helm upgrade`` are different commands and no quoting rule is involved.
The hash is what tickets and the ``Command-Hash`` header carry: ``sha256:`` + lowercase hex.
"""

from __future__ import annotations

import hashlib

import rfc8785

__all__ = ["canonical_command", "command_hash"]


def canonical_command(command: str | list[str]) -> bytes:
    """The bytes a command's hash is taken over; ``TypeError`` for anything but a string or a
    list of strings."""
    if isinstance(command, str):
        return command.encode("utf-8")
    if isinstance(command, list) and all(isinstance(arg, str) for arg in command):
        return rfc8785.dumps(command)
    raise TypeError("a command is a string or a list of strings")


def command_hash(command: str | list[str]) -> str:
    """``sha256:<lowercase hex>`` of the command's canonical bytes."""
    return "sha256:" + hashlib.sha256(canonical_command(command)).hexdigest()
