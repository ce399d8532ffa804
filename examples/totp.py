"""Print the current one-time code (TOTP) of a development identity in examples/identities.yaml.

The dev identities' TOTP secrets are published in that file so that the quickstart and the
walkthrough can step up without an authenticator app::

    python examples/totp.py alice

A code is accepted once (RFC 6238 §5.2): a second step-up within the same 30 s step needs the
next step's code.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import yaml

# Run as a script from a checkout: the control plane's own TOTP is the one thing it imports.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.authn.totp import code_at  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python examples/totp.py SUBJECT", file=sys.stderr)
        return 2
    doc = yaml.safe_load((REPO / "examples" / "identities.yaml").read_text())
    secrets = {i["subject_id"]: i.get("totp_secret") for i in doc["identities"]}
    if not secrets.get(argv[0]):
        print(f"totp: no dev identity with a TOTP secret named {argv[0]!r}", file=sys.stderr)
        return 2
    print(code_at(secrets[argv[0]], time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
