"""``cpctl keys``: rotate and list the token signing keys in the state directory.

Rotation makes a new active key; tokens signed by the old one keep verifying until they expire
(the longest token lifetime plus clock skew), then the old key stops verifying. Running
workers notice the new key by themselves: they look at the key directory when they sign or
meet an unknown key id, so no restart is needed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import clock
from .. import config as config_mod
from ..authn.keyring import KeyRing, KeyRingError


def register(sub: Any) -> None:
    parser = sub.add_parser("keys", help="token signing keys (rotate, list)")
    actions = parser.add_subparsers(dest="keys_command", metavar="ACTION")
    actions.required = True
    for name, func, text in (("rotate", rotate, "make a new active signing key"),
                             ("list", list_keys, "list the keys, their creation dates and which verify "
                              "tokens now (read-only)")):
        p = actions.add_parser(name, help=text)
        p.add_argument("--config", help="the service's YAML configuration (for state_dir)")
        p.set_defaults(func=func)


def _ring(args: argparse.Namespace) -> KeyRing:
    config = config_mod.load_from_process(args.config)
    return KeyRing.open(config.state_dir / "keys", retain_s=config.authn.key_retain_s,
                        now=clock.now())


def rotate(args: argparse.Namespace) -> int:
    try:
        ring = _ring(args)
    except config_mod.ConfigError as exc:
        print(f"cpctl keys rotate: {exc}", file=sys.stderr)
        return 2
    kid = ring.rotate(clock.now())
    print(json.dumps({"active_kid": kid, "verifying": ring.kids(clock.now())}))
    return 0


def list_keys(args: argparse.Namespace) -> int:
    """Read-only: a list creates no directory, key or lock file (the server or a rotate does)."""
    try:
        config = config_mod.load_from_process(args.config)
    except config_mod.ConfigError as exc:
        print(f"cpctl keys list: {exc}", file=sys.stderr)
        return 2
    now = clock.now()
    try:
        ring = KeyRing.read(config.state_dir / "keys", retain_s=config.authn.key_retain_s)
        keys = ring.describe(now)
    except KeyRingError as exc:
        print(f"cpctl keys list: {exc} (state_dir {config.state_dir}; a server start or "
              "`cpctl keys rotate` creates the first key)", file=sys.stderr)
        return 1
    print(json.dumps({
        "active_kid": next((k["kid"] for k in keys if k["active"]), None),
        "verifying": [k["kid"] for k in keys if k["verifying"]],
        "keys": [{**k, "created_at": clock.iso(k["created_at"]),
                  "verify_until": clock.iso(k["verify_until"])} for k in keys],
    }))
    return 0
