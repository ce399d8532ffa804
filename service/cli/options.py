"""Command-line words that argparse alone reads wrongly (no imports beyond the standard library:
``cpctl --version`` loads this)."""

from __future__ import annotations

__all__ = ["option_values"]


def option_values(argv: list[str], options: tuple[str, ...] = ("--nonce",)) -> list[str]:
    """``argv`` with ``--nonce VALUE`` joined into ``--nonce=VALUE``, so a value that starts
    with ``-`` (a nonce minted before they never did) is taken as the value, not an option."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        if word == "--":
            out.append(word)
            out.extend(words)
            break
        if word in options:
            value = next(words, None)
            out.append(word if value is None else f"{word}={value}")
            continue
        out.append(word)
    return out
