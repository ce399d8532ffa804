"""``cpctl identities``: hash passwords; add humans, services and agents to an identities file."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..authn import identities, passwords, totp
from ..authn.keyring import load_public_key
from ..clock import iso

__all__ = ["register", "run"]

_EXIT_OK, _EXIT_ERROR, _EXIT_USAGE = 0, 1, 2


def register(sub: Any) -> None:
    """Add ``identities`` and its subcommands to ``cpctl``'s subparsers."""
    parser = sub.add_parser("identities", help="manage the AuthN identities file")
    commands = parser.add_subparsers(dest="identities_command", metavar="SUBCOMMAND")
    commands.required = True

    hp = commands.add_parser("hash-password", help="print an scrypt hash of a password")
    _add_cost(hp)
    hp.set_defaults(func=hash_password)

    au = commands.add_parser("add-user", help="add a human with a password and a new TOTP secret")
    au.add_argument("subject", help="subject id, e.g. alice")
    au.add_argument(
        "--file", required=True, type=Path, help="identities YAML file (created if missing)"
    )
    au.add_argument("--display-name", default="", help="human-readable name")
    au.add_argument("--issuer", default="controlplane", help="issuer label in the otpauth:// URI")
    _add_cost(au)
    au.set_defaults(func=add_user)

    ak = commands.add_parser("add-key", help="add a service or agent with an Ed25519 public key")
    ak.add_argument("subject", help="subject id, e.g. ci-bot")
    ak.add_argument("--kind", required=True, choices=("service", "agent"))
    ak.add_argument(
        "--file", required=True, type=Path, help="identities YAML file (created if missing)"
    )
    ak.add_argument("--display-name", default="", help="human-readable name")
    source = ak.add_mutually_exclusive_group(required=True)
    source.add_argument("--public-key", type=Path, metavar="PEM", help="PEM file of the public key")
    source.add_argument(
        "--generate",
        type=Path,
        metavar="PRIVATE_OUT",
        help="generate a key pair; write the private key here (0600)",
    )
    ak.set_defaults(func=add_key)

    ls = commands.add_parser(
        "list", help="the identities file's subjects and the federated subjects seen (SSO, CI)"
    )
    ls.add_argument("--config", metavar="FILE", help="the service's configuration file")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=list_identities)


def _add_cost(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scrypt-ln", type=int, default=passwords.DEFAULT_PARAMS.ln, help=argparse.SUPPRESS
    )


def run(argv: Sequence[str]) -> int:
    """Run ``identities`` with ``argv`` (the words after ``cpctl identities``); the exit code."""
    parser = argparse.ArgumentParser(prog="cpctl")
    register(parser.add_subparsers(dest="command"))
    try:
        args = parser.parse_args(["identities", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(args.func(args))


# -- handlers ----------------------------------------------------------------------------------


def hash_password(args: argparse.Namespace) -> int:
    password = _read_password()
    if password is None:
        return _EXIT_ERROR
    print(passwords.hash_password(password, passwords.ScryptParams(ln=args.scrypt_ln)))
    return _EXIT_OK


def add_user(args: argparse.Namespace) -> int:
    password = _read_password()
    if password is None:
        return _EXIT_ERROR
    secret = totp.generate_secret()
    entry: dict[str, Any] = {"subject_id": args.subject, "kind": "human"}
    if args.display_name:
        entry["display_name"] = args.display_name
    entry["password_hash"] = passwords.hash_password(
        password, passwords.ScryptParams(ln=args.scrypt_ln)
    )
    entry["totp_secret"] = secret
    if not _append(args.file, entry):
        return _EXIT_ERROR
    # The secret is shown once, for the user's authenticator app; the file is the only other copy.
    print(totp.provisioning_uri(secret, args.subject, args.issuer))
    return _EXIT_OK


def add_key(args: argparse.Namespace) -> int:
    if args.generate is not None:
        private = Ed25519PrivateKey.generate()
        public = private.public_key()
        pem = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            fd = os.open(args.generate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return _fail(f"{args.generate} exists; refusing to overwrite a private key")
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
    else:
        try:
            public = load_public_key(args.public_key.read_text(encoding="ascii"))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            return _fail(f"cannot use {args.public_key}: {exc}")
    public_pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")
    entry: dict[str, Any] = {"subject_id": args.subject, "kind": args.kind}
    if args.display_name:
        entry["display_name"] = args.display_name
    entry["public_key"] = public_pem
    if not _append(args.file, entry):
        if args.generate is not None:
            args.generate.unlink(missing_ok=True)
        return _EXIT_ERROR
    return _EXIT_OK


# -- helpers -----------------------------------------------------------------------------------


def list_identities(args: argparse.Namespace) -> int:
    """Every subject the service knows: the file's (with kind and state), then the federated
    subjects the store has seen sign in (OIDC people, token-exchange workloads)."""
    from .. import config as config_mod

    try:
        config = config_mod.load_from_process(args.config)
        directory = identities.load(config.authn.identities)
    except (config_mod.ConfigError, identities.IdentitiesError, OSError) as exc:
        return _fail(str(exc))
    rows: list[dict[str, Any]] = [
        {"subject_id": i.subject_id, "kind": i.kind, "source": "file",
         "state": "disabled" if i.disabled else "active"}
        for i in sorted(directory, key=lambda i: i.subject_id)
    ]
    federated, note = asyncio.run(_federated(config))
    rows.extend(federated)
    if args.json:
        print(json.dumps({"identities": rows, "federated_note": note}, indent=2))
        return _EXIT_OK
    for row in rows:
        seen = f"  last seen {iso(row['last_seen'])}" if "last_seen" in row else ""
        print(f"{row['subject_id']:40} {row['kind']:8} {row['source']}{seen}")
    if note:
        print(note, file=sys.stderr)
    return _EXIT_OK


async def _federated(config: Any) -> tuple[list[dict[str, Any]], str | None]:
    from ..store import StoreError, open_store

    url = config.store.url
    if url is None or (config.store.backend == "sqlite" and not config.store.sqlite_path.exists()):
        return [], "no store: federated subjects are not listed"
    try:
        store = await open_store(url.reveal(), schema=config.store.postgres_schema)
    except StoreError as exc:
        return [], f"store unavailable, federated subjects not listed: {exc}"
    try:
        seen = await store.list_federated_subjects(1000)
    finally:
        await store.close()
    return [
        {"subject_id": s.subject_id, "kind": s.kind, "source": s.source,
         "first_seen": s.first_seen, "last_seen": s.last_seen}
        for s in seen
    ], None


def _fail(message: str) -> int:
    print(f"cpctl identities: {message}", file=sys.stderr)
    return _EXIT_ERROR


def _read_password() -> str | None:
    """Prompt twice on a terminal; otherwise read the first line of stdin."""
    if sys.stdin.isatty():
        first = getpass.getpass("Password: ")
        if first != getpass.getpass("Repeat password: "):
            _fail("passwords do not match")
            return None
    else:
        first = sys.stdin.readline().rstrip("\r\n")
    if not first or len(first.encode("utf-8")) > passwords.MAX_PASSWORD_BYTES:
        _fail(f"a password has 1 to {passwords.MAX_PASSWORD_BYTES} bytes")
        return None
    return first


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (PEM keys) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _append(path: Path, entry: dict[str, Any]) -> bool:
    """Add ``entry``: validate the whole file, write it atomically, keep its header comments."""
    header = ""
    if path.exists():
        try:
            document = identities.load_document(path)
        except identities.IdentitiesError as exc:
            _fail(str(exc))
            return False
        text = path.read_text(encoding="utf-8")
        header = "".join(line for line in _leading_comments(text))
    else:
        document = {"identities": []}
    if not isinstance(document, dict) or not isinstance(document.get("identities"), list):
        _fail(f"{path} has no 'identities' list")
        return False
    if any(
        isinstance(e, dict) and e.get("subject_id") == entry["subject_id"]
        for e in document["identities"]
    ):
        _fail(f"subject {entry['subject_id']!r} already exists in {path}")
        return False
    document["identities"].append(entry)
    try:
        identities.parse(document)
    except identities.IdentitiesError as exc:
        _fail(str(exc))
        return False
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    # Same directory, then rename: readers see the old file or the new one, never half of one.
    directory = path.resolve().parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".identities-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(header + body)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def _leading_comments(text: str) -> list[str]:
    lines = []
    for line in text.splitlines(keepends=True):
        if not line.startswith("#") and line.strip():
            break
        lines.append(line)
    return lines
