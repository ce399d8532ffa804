"""Policy data split in two: bulk tables indexed in Python and projected, small ones for Rego.

regopy's object lookups scan keys (~1 us per key), so a data document with thousands of subjects
makes every decision slow. The bulk tables (``roles``, ``bindings``, ``groups``) are therefore
resolved here once per revision; a decision copies only the deciding subject's facts into
``input.principal`` (``roles``, ``groups``, ``grants``). Everything else in the data files, plus
the code-owned action catalogue, forms the (small) Rego data document.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.authz import actions
from service.authz.source import SourceError

__all__ = ["PROJECTED_KEYS", "Projection", "build_projection"]

#: Top-level data keys resolved in Python and projected into input.principal, never in Rego data.
PROJECTED_KEYS = ("roles", "bindings", "groups", "group_bindings")
_GRANT_KEYS = {"actions", "envs", "kinds", "scope"}
#: A ``group_bindings`` key: ``<provider name>:<group>`` (provider names as in the config).
_PROVIDER_GROUP = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}:.+", re.DOTALL)
_KINDS = {"human", "service", "agent"}
_EMPTY: tuple[tuple[str, ...], tuple[str, ...], Mapping[str, tuple[dict[str, Any], ...]]] = (
    (),
    (),
    {},
)


@dataclass(frozen=True)
class Projection:
    """Per-revision indexes: subject -> (roles, groups, grants), and the Rego data document."""

    subjects: Mapping[
        str, tuple[tuple[str, ...], tuple[str, ...], Mapping[str, tuple[dict[str, Any], ...]]]
    ]
    rego_data: Mapping[str, Any]
    role_count: int
    #: ``<provider>:<IdP group>`` -> (roles, grants by action): ``group_bindings``, for
    #: federated sign-ins (the session's groups carry the provider that asserted them).
    idp_groups: Mapping[str, tuple[tuple[str, ...], Mapping[str, tuple[dict[str, Any], ...]]]] = (
        field(default_factory=dict)
    )

    def facts(
        self, subject_id: str, action: str, idp_groups: Sequence[str] = ()
    ) -> dict[str, Any]:
        """The projected fields for ``subject_id`` deciding ``action`` (empty for unknown subjects).

        ``grants`` holds only the grants whose ``actions`` cover ``action`` (without the
        ``actions`` list): input conversion costs one native call per node, so the projection
        carries just what this decision can use.
        """
        roles, groups, by_action = self.subjects.get(subject_id, _EMPTY)
        grants = list(by_action.get(action, ()))
        bound = [self.idp_groups[g] for g in idp_groups if g in self.idp_groups]
        if bound:
            # IdP groups (recorded on an OIDC session at sign-in) add their bound roles' grants;
            # a grant reached twice counts once.
            names = set(roles)
            seen = {id(g) for g in grants}
            for group_roles, group_by_action in bound:
                names.update(group_roles)
                for grant in group_by_action.get(action, ()):
                    if id(grant) not in seen:
                        seen.add(id(grant))
                        grants.append(grant)
            roles = tuple(sorted(names))
        return {
            "roles": list(roles),
            "groups": list(groups),
            "grants": grants,
        }


def build_projection(
    data: Mapping[str, Any], production: Mapping[str, bool] | None = None
) -> Projection:
    """Index the bulk tables of ``data``; raise ``SourceError`` for anything malformed.

    ``production`` (the service configuration's ``environments``: name -> is it production) is
    the one source of the production flag: it replaces ``data.environments[*].production``, see
    ``_environments``. Without it (offline tools) the data files' flags stand.
    """
    roles = _mapping(data.get("roles", {}), "roles")
    bindings = _mapping(data.get("bindings", {}), "bindings")
    groups = _mapping(data.get("groups", {}), "groups")
    group_bindings = _mapping(data.get("group_bindings", {}), "group_bindings")
    flat = _flatten_roles(roles)

    member_of: dict[str, list[str]] = {}
    for group, members in groups.items():
        for subject in _strings(members, f"groups.{group}"):
            member_of.setdefault(subject, []).append(str(group))

    subjects: dict[
        str, tuple[tuple[str, ...], tuple[str, ...], Mapping[str, tuple[dict[str, Any], ...]]]
    ] = {}
    by_role = {name: _by_action(grants) for name, grants in flat.items()}
    for subject in set(bindings) | set(member_of):
        entry = bindings.get(subject, {})
        bound = (
            entry
            if isinstance(entry, list)
            else _mapping(entry, f"bindings.{subject}").get("roles", [])
        )
        names = sorted(set(_strings(bound, f"bindings.{subject}.roles")))
        for name in names:
            if name not in flat:
                raise SourceError(f"bindings.{subject}: unknown role {name!r}")
        by_action: dict[str, list[dict[str, Any]]] = {}
        seen: set[tuple[str, int]] = set()
        for name in names:
            for action, grants in by_role[name].items():
                for grant in grants:
                    # a role inherited twice contributes each grant once
                    if (action, id(grant)) not in seen:
                        seen.add((action, id(grant)))
                        by_action.setdefault(action, []).append(grant)
        subjects[str(subject)] = (
            tuple(names),
            tuple(sorted(member_of.get(subject, []))),
            {a: tuple(g) for a, g in by_action.items()},
        )

    idp_groups: dict[str, tuple[tuple[str, ...], Mapping[str, tuple[dict[str, Any], ...]]]] = {}
    for group, entry in group_bindings.items():
        if not _PROVIDER_GROUP.fullmatch(str(group)):
            # A group belongs to the provider that asserted it: a bare name would bind every
            # provider's group of that name (a partner's "sre" would get the corporate one's).
            raise SourceError(
                f"group_bindings.{group}: a bare group name binds nothing; name the sign-in "
                f"provider that asserts it, as '<provider>:{group}' (e.g. 'corp:{group}')"
            )
        bound = _mapping(entry, f"group_bindings.{group}").get("roles", [])
        names = sorted(set(_strings(bound, f"group_bindings.{group}.roles")))
        for name in names:
            if name not in flat:
                raise SourceError(f"group_bindings.{group}: unknown role {name!r}")
        merged: dict[str, list[dict[str, Any]]] = {}
        for name in names:
            for action, grants in by_role[name].items():
                for grant in grants:
                    if all(grant is not g for g in merged.get(action, [])):
                        merged.setdefault(action, []).append(grant)
        idp_groups[str(group)] = (tuple(names), {a: tuple(g) for a, g in merged.items()})

    if "controlplane" in data:
        raise SourceError("data key 'controlplane' is reserved for the engine (action catalogue)")
    rego_data = {k: v for k, v in data.items() if k not in PROJECTED_KEYS}
    if production is not None:
        rego_data["environments"] = _environments(data.get("environments", {}), production)
    rego_data["controlplane"] = {
        "catalogue": {
            "actions": {
                a.name: {"mutating": a.mutating, "ticketed": a.needs_ticket_in_production}
                for a in actions.all_actions()
            }
        }
    }
    return Projection(subjects, rego_data, len(flat), idp_groups)


def _environments(table: Any, production: Mapping[str, bool]) -> dict[str, Any]:
    """``data.environments`` with the configuration's production flags.

    Every configured environment is present, its ``production`` from the configuration; an
    environment only the data file names counts as production (as the configuration treats
    unknown environments: fail closed). ``agent_requires_approval`` stays as the data file says,
    and defaults to the production flag where the file does not say.
    """
    entries = _mapping(table, "environments")
    out: dict[str, Any] = {}
    for name in [*production, *(n for n in entries if n not in production)]:
        entry = dict(_mapping(entries.get(name, {}), f"environments.{name}"))
        flag = bool(production.get(name, True))
        entry["production"] = flag
        entry.setdefault("agent_requires_approval", flag)
        out[str(name)] = entry
    return out


def _by_action(grants: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """catalogue action -> the grants (without their ``actions`` list) that cover it."""
    out: dict[str, list[dict[str, Any]]] = {}
    for grant in grants:
        slim = grant["slim"]
        for action in actions.ACTIONS:
            if any(_covers(p, action) for p in grant["actions"]):
                out.setdefault(action, []).append(slim)
    return out


def _covers(pattern: str, action: str) -> bool:
    """``*`` covers everything, ``area.*`` every action under ``area.``, else exact names."""
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return action.startswith(pattern[:-1])
    return pattern == action


def _flatten_roles(roles: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """role -> its grants plus every inherited role's grants (tagged with their role)."""
    own: dict[str, list[dict[str, Any]]] = {}
    parents: dict[str, list[str]] = {}
    for name, spec in roles.items():
        spec = _mapping(spec, f"roles.{name}")
        own[name] = [
            _grant(g, f"roles.{name}.grants[{i}]", name)
            for i, g in enumerate(spec.get("grants", []) or [])
        ]
        parents[name] = _strings(spec.get("inherits", []) or [], f"roles.{name}.inherits")
    flat: dict[str, list[dict[str, Any]]] = {}

    def resolve(name: str, stack: tuple[str, ...]) -> list[dict[str, Any]]:
        if name in flat:
            return flat[name]
        if name in stack:
            raise SourceError(f"roles: inheritance cycle {' -> '.join((*stack, name))}")
        if name not in own:
            raise SourceError(f"roles.{stack[-1]}.inherits: unknown role {name!r}")
        out = list(own[name])
        for parent in parents[name]:
            out.extend(resolve(parent, (*stack, name)))
        flat[name] = out
        return out

    for name in own:
        resolve(name, ())
    return flat


def _grant(raw: Any, where: str, role: str) -> dict[str, Any]:
    grant = _mapping(raw, where)
    unknown = set(grant) - _GRANT_KEYS
    if unknown:
        raise SourceError(f"{where}: unknown field(s) {sorted(unknown)}")
    acts = _strings(grant.get("actions"), f"{where}.actions")
    for pattern in acts:
        # Typos in action names would silently grant nothing; refuse the revision instead.
        if pattern != "*" and not pattern.endswith(".*") and pattern not in actions.ACTIONS:
            raise SourceError(f"{where}.actions: unknown action {pattern!r}")
    out: dict[str, Any] = {
        "role": role,
        "actions": acts,
        "envs": _strings(grant.get("envs"), f"{where}.envs"),
    }
    if "kinds" in grant:
        kinds = _strings(grant["kinds"], f"{where}.kinds")
        if set(kinds) - _KINDS:
            raise SourceError(f"{where}.kinds: must be among {sorted(_KINDS)}")
        out["kinds"] = kinds
    if "scope" in grant:
        if grant["scope"] not in ("self", "any"):
            raise SourceError(f"{where}.scope: must be 'self' or 'any'")
        out["scope"] = grant["scope"]
    # What the policy sees: one shared object per grant (projection copies no dicts per decision).
    out["slim"] = {k: v for k, v in out.items() if k != "actions"}
    return out


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SourceError(f"{where}: must be a mapping")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SourceError(f"{where}: must be a list of strings")
    return list(value)
