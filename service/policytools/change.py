"""What a policy-change ticket's reviewers see: the change and its impact.

For a ``policy.publish``, ``policy.activate`` or rollback ticket, ``report`` gives the signed
message and author of the candidate revision, how it was vetted, a diff of its modules and data
against the revision the fleet runs (the active one, or the directory's when none is), and its
**impact**: the recent decision log replayed against the candidate (``replay``), counted by
transition (``allow->deny`` ...) with examples. The candidate is the published revision, or the
proposed one a publish request left for review (``policy_candidates``); a rollback to directory
mode compares the directory's policies.
"""

from __future__ import annotations

import asyncio
import difflib
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..authz.engine import PolicyEngine
from ..authz.revisions import Bundle, BundleError, SignatureError, materialize, verify
from ..lru import LRU
from ..store.base import PolicyRevisionRecord, Store
from .replay import ReplayError, from_log, replay

__all__ = ["ACTIONS", "DIRECTORY", "brief", "diff", "impact", "report"]

#: The tickets that carry a policy change.
ACTIONS = ("policy.publish", "policy.activate")
#: A rollback's resource when it returns to directory mode (``api.policy_revisions``).
DIRECTORY = "directory"
#: At most this many recent decisions are replayed, and this many characters of diff text kept.
MAX_REPLAYED = 5000
MAX_DIFF_CHARS = 200_000
_EXAMPLES = 5
#: Impact reports by (candidate digest, environments, decision log and its size and mtime): the
#: ticket page, its live reloads, the API and the notification ask for the same report, which
#: compiles the candidate and replays up to MAX_REPLAYED decisions; a new log line is a new key.
_IMPACTS: LRU[tuple[Any, ...], dict[str, Any]] = LRU(32)


def _files(bundle: Bundle) -> dict[str, str]:
    return {**dict(bundle.modules), **{f"data/{n}": t for n, t in bundle.data.items()}}


def diff(base: Bundle | None, candidate: Bundle) -> dict[str, Any]:
    """Per file (``*.rego``, ``data/*``): added, removed or changed, with lines added and
    removed; the totals; and the unified diff text (cut at ``MAX_DIFF_CHARS``)."""
    old, new = _files(base) if base else {}, _files(candidate)
    files, chunks = [], []
    for name in sorted(old.keys() | new.keys()):
        before, after = old.get(name), new.get(name)
        if before == after:
            continue
        a = (before or "").splitlines(keepends=True)
        b = (after or "").splitlines(keepends=True)
        lines = list(difflib.unified_diff(a, b, f"a/{name}", f"b/{name}"))
        added = sum(1 for x in lines if x.startswith("+") and not x.startswith("+++"))
        removed = sum(1 for x in lines if x.startswith("-") and not x.startswith("---"))
        status = "added" if before is None else "removed" if after is None else "changed"
        files.append({"file": name, "status": status, "added": added, "removed": removed})
        chunks.append("".join(x if x.endswith("\n") else x + "\n" for x in lines))
    text = "".join(chunks)
    return {"files": files, "added": sum(f["added"] for f in files),
            "removed": sum(f["removed"] for f in files),
            "text": text[:MAX_DIFF_CHARS], "truncated": len(text) > MAX_DIFF_CHARS}


def impact(candidate: Bundle, environments: Mapping[str, bool],
           decision_log: Path | None) -> dict[str, Any]:
    """The recent decision log replayed against ``candidate``. Blocking (compiles it); cached
    until the log changes."""
    if decision_log is None:
        return {"available": False,
                "why": "no decision log is configured (decision_log.path): nothing to replay"}
    try:
        stat = decision_log.stat()
        seen: tuple[int, int] | None = (stat.st_size, stat.st_mtime_ns)
    except OSError:
        seen = None
    key = (candidate.digest, tuple(sorted(environments.items())), str(decision_log), seen)
    cached = _IMPACTS.get(key)
    if cached is None:
        cached = _impact(candidate, environments, decision_log)
        _IMPACTS.put(key, cached)
    return cached


def _impact(candidate: Bundle, environments: Mapping[str, bool], decision_log: Path
            ) -> dict[str, Any]:
    try:
        records = from_log(decision_log)[-MAX_REPLAYED:] if decision_log.exists() else []
    except ReplayError as exc:
        return {"available": False, "why": f"the decision log cannot be read: {exc}"}
    with tempfile.TemporaryDirectory(prefix="cp-impact-") as tmp:
        engine = PolicyEngine(materialize(candidate, Path(tmp)), environments, cache_size=0,
                              vet_in_subprocess=False, vet_tests=False)
        engine.log_decisions = False
        loaded = engine.load()
        if not loaded.ok:
            return {"available": False, "why": f"the candidate does not load: {loaded.error}"}
        result = replay(records, engine.decide)
    doc = result.to_json(examples=_EXAMPLES)
    return {"available": True, "total": doc["total"], "changed": doc["changed"],
            "unchanged": doc["unchanged"],
            "groups": {t: {"count": g["count"], "examples": [
                {k: e[k] for k in ("ts", "subject", "action", "env", "recorded", "candidate")}
                for e in g["examples"]]} for t, g in doc["groups"].items()}}


def summary(impact_doc: Mapping[str, Any]) -> str:
    """"37 of 1204 recent decisions would change: allow->deny 35, deny->allow 2"."""
    if not impact_doc.get("available"):
        return str(impact_doc.get("why"))
    groups = impact_doc.get("groups") or {}
    parts = ", ".join(f"{t} {g['count']}" for t, g in groups.items())
    return (f"{impact_doc['changed']} of {impact_doc['total']} recent decisions would change"
            + (f": {parts}" if parts else ""))


async def _bundle(store: Store, revision: str, trusted: Mapping[str, Any]
                  ) -> tuple[Bundle, PolicyRevisionRecord, str] | None:
    for source, get in (("published", store.get_policy_revision),
                        ("proposed", store.get_policy_candidate)):
        rec = await get(revision)
        if rec is None:
            continue
        try:
            bundle = Bundle.from_doc(rec.bundle)
            verify(bundle, rec.signature, trusted, revision=rec.id)
        except (BundleError, SignatureError):
            return None  # never shown as if it were a trustworthy change
        return bundle, rec, source
    return None


async def report(store: Store, trusted: Mapping[str, Any], action: str, resource: Any,
                 directory: Path, environments: Mapping[str, bool],
                 decision_log: Path | None) -> dict[str, Any] | None:
    """The change a policy ticket is about, or None for other tickets (or a candidate that
    is not readable or not signed by a trusted key). Runs the blocking parts in a thread."""
    revision = resource.get("revision") if isinstance(resource, Mapping) else None
    if action not in ACTIONS or not isinstance(revision, str):
        return None
    active = await store.active_policy()
    base: Bundle | None = None
    against = "the policies directory"
    if active is not None and active.revision_id:
        found = await _bundle(store, active.revision_id, trusted)
        if found is not None:
            base, against = found[0], active.revision_id
    if base is None:
        base = await asyncio.to_thread(_from_dir, directory)
    if revision == DIRECTORY:
        candidate = await asyncio.to_thread(_from_dir, directory)
        if candidate is None:
            return None
        head: dict[str, Any] = {"revision": None, "source": "directory", "author": None,
                                "message": "back to directory mode", "kid": None,
                                "created_at": None}
        vetting: dict[str, Any] = {"passed": None,
                                   "by": "each replica, when it loads its policies.dir"}
    else:
        found = await _bundle(store, revision, trusted)
        if found is None:
            return None
        candidate, rec, source = found
        head = {"revision": rec.id, "source": source, "author": rec.author,
                "message": rec.message, "kid": rec.kid, "created_at": rec.created_at}
        # Nothing reaches policy_revisions or policy_candidates without passing the server's
        # vetting: compile, probe decision and every *_test.rego of the bundle.
        vetting = {"passed": True, "by": "the server before it stored the revision "
                                        "(compile, probe decision, *_test.rego)"}
    changes = diff(base, candidate)
    effect = await asyncio.to_thread(impact, candidate, environments, decision_log)
    return {**head, "against": against, "vetting": vetting, "diff": changes,
            "impact": effect, "impact_summary": summary(effect)}


def brief(report_doc: Mapping[str, Any]) -> dict[str, Any]:
    """A report without the diff text and examples: what a notification carries."""
    d = report_doc.get("diff") or {}
    return {"revision": report_doc.get("revision"), "author": report_doc.get("author"),
            "message": report_doc.get("message"), "against": report_doc.get("against"),
            "vetting": report_doc.get("vetting"),
            "diff": {"files": d.get("files") or [], "added": d.get("added", 0),
                     "removed": d.get("removed", 0)},
            "impact_summary": report_doc.get("impact_summary")}


def _from_dir(directory: Path) -> Bundle | None:
    try:
        return Bundle.from_dir(directory)
    except BundleError:
        return None
