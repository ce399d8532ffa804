"""``cpctl policy keygen | publish | activate | rollback | revisions``: policy revisions for a fleet.

``publish`` vets the revision here exactly as every server does before it loads one (compile,
probe decision, ``*_test.rego``, in a child process), then checks the decision cases, signs the
bundle with the publisher's Ed25519 key (JWS, ``authz.revisions``) and sends it; nothing about
the signature is trusted from the server. ``activate`` and ``rollback`` set the fleet's active
revision. In a fleet that serves production each of them needs step-up and an approved ticket
bound to the revision: like ``installer run`` (``protected.Protected``), each command steps up,
requests the ticket the server names, waits for the reviewers and presents it itself;
``--ticket ID`` presents one requested earlier (its kept nonce, or ``--nonce``).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .. import clock
from .. import config as config_mod
from ..audit.record import scrub, seal
from ..authz.activations import ActivationSigner, activation_keys
from ..authz.engine import DEFAULT_ENVIRONMENTS, PolicyEngine
from ..authz.regotest import run_tests_isolated
from ..authz.revisions import (
    Bundle,
    BundleError,
    SignatureError,
    TrustedKeys,
    key_id,
    load_private_key,
    sign,
    verify,
)
from ..policytools.cases import CaseError, load_cases
from ..store import open_store
from ..store.base import StoreError
from . import client as http
from . import policy, policydir
from .client import EXIT_OK, UsageError, guarded
from .options import option_values
from .protected import Protected

__all__ = ["extend", "run"]

_REPO = Path(__file__).resolve().parents[2]


def extend(policy_parser: argparse.ArgumentParser) -> None:
    """Add the revision subcommands to ``cpctl policy`` (its existing subparsers)."""
    # argparse has no accessor for an existing subparsers action.
    commands = next(a for a in policy_parser._actions
                    if isinstance(a, argparse._SubParsersAction))
    conn = http.connection_parent()
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--json", action="store_true", help="print the server's JSON answer")
    ticket = argparse.ArgumentParser(add_help=False)
    ticket.add_argument("--ticket", metavar="ID",
                        help="present this ticket instead of requesting one (its nonce is the "
                             "one cpctl kept when it was requested, unless --nonce is given)")
    ticket.add_argument("--nonce", help="the ticket's nonce, if cpctl did not keep it")
    ticket.add_argument("--otp", metavar="CODE",
                        help="one-time code for the step-up (prompted for when needed and absent)")

    kg = commands.add_parser("keygen", help="create a policy-signing key (Ed25519)")
    kg.add_argument("key", type=Path, metavar="KEY.pem",
                    help="private key to write (0600); the public key goes to KEY.pub.pem")
    kg.set_defaults(func=guarded(keygen))

    pb = commands.add_parser("publish", parents=[conn, out, ticket],
                             help="vet, sign and publish a policies directory as a revision")
    pb.add_argument("dir", nargs="?", type=Path, default=None,
                    help="policies directory (default: ./policies, else the configured "
                         "policies.dir; the one used is printed)")
    pb.add_argument("--key", type=Path, required=True, help="the policy-signing private key")
    pb.add_argument("--message", "-m", default="", help="why (signed, shown in revisions)")
    pb.add_argument("--author", default=None, help="who wrote it (default: the local user)")
    pb.add_argument("--cases", type=Path, default=_REPO / "examples" / "decisions",
                    help="decision cases the revision must satisfy (default: examples/decisions)")
    pb.add_argument("--no-cases", action="store_true", help="do not check decision cases")
    pb.add_argument("--out", type=Path, default=None,
                    help="write the signed request body to this file instead of sending it")
    pb.set_defaults(func=guarded(publish))

    ac = commands.add_parser("activate", parents=[conn, out, ticket],
                             help="make a published revision the fleet's active one")
    ac.add_argument("revision", metavar="REVISION")
    ac.add_argument("--reason", help="why (recorded with the activation)")
    ac.set_defaults(func=guarded(activate))

    rb = commands.add_parser("rollback", parents=[conn, out, ticket],
                             help="activate the revision that was active before the current one")
    rb.add_argument("--reason", help="why (recorded with the activation)")
    rb.set_defaults(func=guarded(rollback))

    bg = commands.add_parser(
        "break-glass", parents=[out],
        help="offline, for a revision that locks out its own approvers: sign an activation with "
             "an activation key and write it to the store directly (no server, no ticket; "
             "audited)")
    target = bg.add_mutually_exclusive_group(required=True)
    target.add_argument("revision", metavar="REVISION", nargs="?",
                        help="a published revision to activate")
    target.add_argument("--directory", action="store_true",
                        help="back to directory mode: every replica runs its policies.dir")
    bg.add_argument("--activation-key", type=Path, required=True, metavar="KEY.pem",
                    help="an Ed25519 key whose public half every replica lists in "
                         "policies.store.trusted_activation_keys (or its activation_key)")
    bg.add_argument("--reason", required=True, help="why (signed, recorded and audited)")
    bg.add_argument("--config", metavar="FILE",
                    help="the service's configuration, for its store (env CONTROLPLANE_CONFIG)")
    bg.set_defaults(func=guarded(break_glass))

    ls = commands.add_parser("revisions", parents=[conn, out],
                             help="published revisions: who, when, why, and which is active")
    ls.add_argument("--limit", type=int, default=20, help="at most this many (1-200)")
    ls.set_defaults(func=guarded(revisions))


def run(argv: list[str]) -> int:
    """Run ``cpctl policy`` with ``argv`` (its words after ``policy``); the exit code. The
    parser is ``cpctl``'s ``policy`` group as ``main`` builds it (``policy.register``, then
    ``extend``), without the other groups: ``main`` imports this module, not the reverse."""
    parser = argparse.ArgumentParser(prog="cpctl")
    commands = parser.add_subparsers(dest="command", required=True)
    extend(policy.register(commands))
    try:
        args = parser.parse_args(option_values(["policy", *argv]))
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(args.func(args))


# -- handlers ----------------------------------------------------------------------------------


def keygen(args: argparse.Namespace) -> int:
    path: Path = args.key
    public_path = path.with_name(path.name.removesuffix(".pem") + ".pub.pem")
    if path.exists() or public_path.exists():
        raise UsageError(f"{path} or {public_path} exists; not overwriting a key")
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    public_path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    print(f"private key: {path} (keep it with the publisher; never on the servers)")
    print(f"public key:  {public_path} (list it in policies.store.trusted_keys)")
    print(f"kid:         {key_id(key.public_key())}")
    return EXIT_OK


def publish(args: argparse.Namespace) -> int:
    try:
        policies, how = policydir.resolve(args.dir)
    except policydir.PolicyDirError as exc:
        raise UsageError(str(exc)) from None
    print(f"policies: {policies} ({how})", file=sys.stderr)
    try:
        key = load_private_key(args.key)
        bundle = Bundle.from_dir(policies)
        snapshot = bundle.snapshot()
    except (SignatureError, BundleError) as exc:
        raise UsageError(str(exc)) from None
    # The server's own vetting, in a child process as the server runs it.
    report = run_tests_isolated(snapshot, mode="vet")
    if not report.ok:
        raise UsageError(f"the revision is rejected: {report.summary()}")
    print(f"vetted {snapshot.revision}: {len(snapshot.modules)} modules, {report.summary()}",
          file=sys.stderr)
    if not args.no_cases and args.cases.exists():
        _check_cases(policies, args.cases)
    body = {"bundle": bundle.to_doc(), "signature": sign(
        bundle, key, author=args.author or getpass.getuser(), message=args.message,
        created_at=clock.iso(clock.now()) or "", revision=snapshot.revision)}
    if args.out is not None:
        args.out.write_text(json.dumps(body), encoding="utf-8")
        print(f"signed {snapshot.revision} ({bundle.digest}) written to {args.out}")
        return EXIT_OK
    api = http.client_for(args)
    answer = _protected(args, api, "publish", args.message or None).send(
        lambda headers: api.post("/api/v1/policy/revisions", body, headers=headers))
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
    else:
        print(f"published {answer['id']} ({answer['digest']}); activate it with "
              f"`cpctl policy activate {answer['id']}`")
    return EXIT_OK


def _check_cases(policies: Path, cases_dir: Path) -> None:
    try:
        cases = load_cases(cases_dir)
    except CaseError as exc:
        raise UsageError(f"decision cases: {exc}") from None
    engine = PolicyEngine(policies, DEFAULT_ENVIRONMENTS, cache_size=0, vet_in_subprocess=False)
    result = engine.load()
    if not result.ok:
        raise UsageError(f"the revision is rejected: {result.error}")
    failed = [c.id for c in cases if c.mismatch(engine.decide(c.input)) is not None]
    if failed:
        raise UsageError(f"{len(failed)} of {len(cases)} decision cases fail "
                         f"(`cpctl policy check` shows them): {', '.join(failed[:5])}")
    print(f"{len(cases)} decision cases pass", file=sys.stderr)


def activate(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"revision": args.revision}
    if args.reason:
        body["reason"] = args.reason
    api = http.client_for(args)
    answer = _protected(args, api, "activate", args.reason).send(
        lambda headers: api.post("/api/v1/policy/activation", body, headers=headers))
    return _print_activation(args, answer)


def rollback(args: argparse.Namespace) -> int:
    body = {"reason": args.reason} if args.reason else {}
    api = http.client_for(args)
    answer = _protected(args, api, "rollback", args.reason).send(
        lambda headers: api.post("/api/v1/policy/rollback", body, headers=headers))
    return _print_activation(args, answer)


def break_glass(args: argparse.Namespace) -> int:
    """Write a signed activation straight to the store, with its audit record in the same
    transaction: the way out when the active revision denies everyone who could approve a
    change. Only a key the replicas trust for activations makes them follow it."""
    try:
        config = config_mod.load_from_process(args.config)
        signer = ActivationSigner.from_file(args.activation_key)
        trusted = TrustedKeys.from_files(config.policies.store.trusted_keys)
        own = config.policies.store.activation_key
        followed = activation_keys(config.policies.store.trusted_activation_keys,
                                   ActivationSigner.from_file(own) if own else None)
    except (config_mod.ConfigError, SignatureError) as exc:
        raise UsageError(str(exc)) from None
    if signer.kid not in followed:
        # Written anyway, no replica would follow it: the way out would be spent for nothing.
        raise UsageError(f"{args.activation_key} (kid {signer.kid}) is not an activation key "
                         "the replicas trust (policies.store.trusted_activation_keys)")
    if config.store.url is None:
        raise UsageError("the configuration has no store (store.backend is none)")
    if config.store.backend == "sqlite" and not config.store.sqlite_path.exists():
        raise UsageError(f"no store at {config.store.sqlite_path} (is --config the service's?)")
    try:
        activation = asyncio.run(_break_glass(
            config.store.url.reveal(), config.store.postgres_schema
            if config.store.backend == "postgres" else None,
            "" if args.directory else args.revision, signer, trusted, args.reason))
    except StoreError as exc:
        raise UsageError(f"the store: {exc}") from None
    if args.json:
        print(json.dumps(activation, indent=2, sort_keys=True))
    else:
        print(f"break-glass activation seq {activation['seq']}: "
              f"{activation['revision'] or 'directory mode'} (was "
              f"{activation['previous'] or 'none'}), signed by {signer.kid}; audited. Every "
              "replica that trusts this key follows it within its convergence bound.")
    return EXIT_OK


async def _break_glass(url: str, schema: str | None, revision: str, signer: ActivationSigner,
                       trusted: TrustedKeys, reason: str) -> dict[str, Any]:
    store = await open_store(url, schema=schema)
    try:
        if revision:
            rec = await store.get_policy_revision(revision)
            if rec is None:
                raise UsageError(f"no published revision {revision} in the store")
            try:  # what no replica would run is not activated, even by break-glass
                verify(Bundle.from_doc(rec.bundle), rec.signature, trusted, revision=rec.id)
            except (SignatureError, BundleError) as exc:
                raise UsageError(f"the revision's signature is not trusted here: {exc}") from None
        who = f"break-glass:{getpass.getuser()}"
        now = clock.now()
        async with store.transaction() as tx:
            activation = await tx.activate_policy_revision(
                revision, kind="break_glass", by=who, at=now, reason=reason,
                sign=lambda a: signer.sign(a, None))
            await tx.append_audit(scrub({
                "at": clock.iso(now), "correlation_id": None,
                "principal": {"subject_id": who, "kind": "break_glass", "session_id": None},
                "action": "policy.break_glass", "method": "CLI",
                "path": "cpctl policy break-glass", "outcome": "executed",
                "revision": revision or None, "previous": activation.previous_id or None,
                "seq": activation.seq, "kind": "break_glass", "reason": reason,
                "activation_kid": signer.kid}), seal)
    finally:
        await store.close()
    return {"seq": activation.seq, "revision": activation.revision_id or None,
            "previous": activation.previous_id or None, "kind": activation.kind,
            "activated_by": who, "reason": reason}


def revisions(args: argparse.Namespace) -> int:
    answer = http.client_for(args).get("/api/v1/policy/revisions", {"limit": args.limit})
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
        return EXIT_OK
    active = answer.get("active")
    print(f"active: {active['revision'] or 'none: directory mode'} (seq {active['seq']}, "
          f"{active['kind']} by "
          f"{active['activated_by']} at {active['activated_at']})" if active
          else "active: none (every replica serves its policies.dir)")
    for item in answer["items"]:
        mark = "*" if item["active"] else " "
        print(f"{mark} {item['id']}  {item['published_at']}  {item['author']} "
              f"(published by {item['published_by']})  {item['message']}")
    return EXIT_OK


def _print_activation(args: argparse.Namespace, answer: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
    else:
        active = answer["revision"] or "none: directory mode (every replica runs its policies.dir)"
        print(f"active: {active} (seq {answer['seq']}, {answer['kind']}; was "
              f"{answer['previous'] or 'none'}); every replica follows within its "
              "convergence bound (see authz/status)")
    return EXIT_OK


def _protected(args: argparse.Namespace, api: http.Client, verb: str,
               reason: str | None) -> Protected:
    """The request -> wait -> present flow every protected cpctl command shares."""
    return Protected(api, prog=f"cpctl policy {verb}", what=f"the {verb}", reason=reason,
                     ticket=args.ticket, nonce=args.nonce, otp=args.otp, quiet=args.json)
