"""Who a federated person or workload becomes: claim text, e-mail addresses, subject templates.

A foreign claim becomes part of a ``subject_id`` (and so of policy input, audit records, logs
and store rows) only when it is plain text: no control characters (CR, LF, NUL, ...), no format
characters (the right-to-left override and other bidirectional controls, zero-width joiners),
no surrogates, private-use or unassigned code points. An e-mail address counts only when it is
one ``local@domain`` addr-spec (a dot-atom local part, a host name of letters, digits and
hyphens); quoted local parts, comments and a second ``@`` are refused rather than interpreted.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_SUBJECT", "fill", "is_plain", "parse_email"]

#: The policy input's ``subject_id`` bound.
MAX_SUBJECT = 200
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_DOT_ATOM = re.compile(rf"{_ATOM}(?:\.{_ATOM})*")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_plain(value: Any, max_length: int = MAX_SUBJECT) -> bool:
    """A non-empty string of at most ``max_length`` characters, none of them a control, format,
    surrogate, private-use or unassigned code point, nor a line or paragraph separator."""
    if not isinstance(value, str) or not value or len(value) > max_length:
        return False
    return all(
        not ((cat := unicodedata.category(c))[0] == "C" or cat in ("Zl", "Zp")) for c in value
    )


def parse_email(value: Any) -> tuple[str, str] | None:
    """``(local part, lower-cased domain)`` of an RFC 5321/5322 addr-spec in its plain form
    (dot-atom ``@`` host name), or None for anything else."""
    if not isinstance(value, str) or len(value) > 254 or value.count("@") != 1:
        return None
    local, _, domain = value.partition("@")
    if len(local) > 64 or not _DOT_ATOM.fullmatch(local):
        return None
    labels = domain.split(".")
    if len(domain) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return None
    return local, domain.lower()


def fill(template: str, claims: Mapping[str, Any]) -> str | None:
    """``template`` with each ``{claim}`` replaced by that claim's plain string value; None when
    a claim is missing, not a string, not plain text, or the result is too long."""
    out: list[str] = []
    for literal, name, spec, conv in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        value = claims.get(name)
        if spec or conv or not isinstance(value, str) or not is_plain(value):
            return None
        out.append(value)
    subject = "".join(out)
    return subject if is_plain(subject) else None
