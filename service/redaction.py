"""The one list of secret field names, for log lines, audit records and anything else that
must not carry a credential.

A field is secret when any word of its name (split at every non-alphanumeric character) is a
secret word, or two adjacent words form one (``api_key``, ``private_key``). Matching words, not
substrings, keeps ``compose_passed`` or ``bypass`` readable while ``access_token``,
``client_secret`` and ``X-Api-Key`` are caught.
"""

from __future__ import annotations

import itertools
import re

__all__ = ["SECRET_BY_NAME", "SECRET_WORDS", "is_secret_field"]

SECRET_WORDS = frozenset({
    "password", "passwd", "passphrase", "secret", "secrets", "token", "tokens", "otp", "nonce",
    "dsn", "authorization", "cookie", "cookies", "assertion", "credential", "credentials",
    "apikey", "privatekey",
})
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key")})
_WORD = re.compile(r"[a-z0-9]+")


def is_secret_field(name: object) -> bool:
    """True when a field called ``name`` may hold a credential and must be masked or dropped."""
    secret = SECRET_BY_NAME.get(name)
    if secret is None:
        if len(SECRET_BY_NAME) >= _MAX_NAMES:  # a caller's own names can only churn it
            SECRET_BY_NAME.clear()
        secret = SECRET_BY_NAME[name] = _is_secret_name(name if isinstance(name, str)
                                                        else str(name))
    return secret


#: ``is_secret_field``'s answers by name. Field names repeat (every log line and audit record
#: has the same few dozen), so callers that walk every key of a value (the log formatter, the
#: audit scrub) look a name up here first, without a call, and ask ``is_secret_field`` only
#: for a name it does not hold. Bounded: emptied when full.
SECRET_BY_NAME: dict[object, bool] = {}
_MAX_NAMES = 8192


def _is_secret_name(name: str) -> bool:
    words = _WORD.findall(name.lower())
    return any(w in SECRET_WORDS for w in words) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )
