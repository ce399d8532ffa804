"""The one list of secret field names, for log lines, audit records and anything else that
must not carry a credential.

A field is secret when any word of its name (split at every non-alphanumeric character) is a
secret word, or two adjacent words form one (``api_key``, ``private_key``). Matching words, not
substrings, keeps ``compose_passed`` or ``bypass`` readable while ``access_token``,
``client_secret`` and ``X-Api-Key`` are caught.
"""

from __future__ import annotations

import functools
import itertools
import re

__all__ = ["SECRET_WORDS", "is_secret_field"]

SECRET_WORDS = frozenset({
    "password", "passwd", "passphrase", "secret", "secrets", "token", "tokens", "otp", "nonce",
    "dsn", "authorization", "cookie", "cookies", "assertion", "credential", "credentials",
    "apikey", "privatekey",
})
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key")})
_WORD = re.compile(r"[a-z0-9]+")


def is_secret_field(name: object) -> bool:
    """True when a field called ``name`` may hold a credential and must be masked or dropped."""
    return _is_secret_name(name if isinstance(name, str) else str(name))


# Field names repeat (every log line and audit record has the same few dozen): the answer is
# cached. A caller's own names (a JSON body's keys) can only churn the bounded cache.
@functools.lru_cache(maxsize=4096)
def _is_secret_name(name: str) -> bool:
    words = _WORD.findall(name.lower())
    return any(w in SECRET_WORDS for w in words) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )
