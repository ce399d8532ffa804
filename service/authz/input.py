"""The policy input document (DESIGN.md section 4): built, validated, stripped and projected."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service import schemas

__all__ = ["INPUT_SCHEMA", "STRIPPED_CONTEXT_FIELDS", "build_input", "compose_value", "strip",
           "validate_input"]

INPUT_SCHEMA = "authz-input.schema.json"

#: Removed from the input BEFORE evaluation: the policy cannot read them, so the decision cache
#: may ignore them. They vary per request and go to the decision log instead.
STRIPPED_CONTEXT_FIELDS = ("correlation_id", "time")

#: Principal fields only the engine may set (from policy data); a caller's values are dropped.
PROJECTED_PRINCIPAL_FIELDS = ("roles", "groups", "grants")


def build_input(
    principal: Mapping[str, Any],
    action: str,
    resource: Mapping[str, Any],
    env: str,
    context: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The input document from AuthN's ``Principal.to_input(now)`` dict and the route's facts."""
    return {
        "principal": {k: v for k, v in principal.items() if k not in PROJECTED_PRINCIPAL_FIELDS},
        "action": action,
        "resource": dict(resource),
        "env": env,
        "context": dict(context or {}),
    }


def compose_value(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``input.resource.value`` of ``compose.import``: the project's name and each service's
    image, not the whole fields document its ``hash`` covers.

    The fields carry environment maps, secrets' sources and labels (credentials, often) and may
    be 256 KiB: the preflight rules judge their content, while the policy decides who may run a
    preflight of which project and images. So the input (and the decision log, replay and
    shadow evaluation, which keep it) holds this summary, never the full document.
    """
    services = fields.get("services")
    return {
        "name": fields.get("name"),
        "services": {
            str(name): {"image": svc.get("image") if isinstance(svc, Mapping) else None}
            for name, svc in (services.items() if isinstance(services, Mapping) else ())
        },
    }


def validate_input(doc: Any) -> None:
    """Raise ``service.schemas.ValidationFailed`` (JSON pointers) for an invalid ``doc``."""
    schemas.validate(INPUT_SCHEMA, doc)


def strip(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``doc`` the policy sees: no correlation id/time, no caller projections."""
    out = dict(doc)
    context = out.get("context")
    if isinstance(context, Mapping):
        out["context"] = {k: v for k, v in context.items() if k not in STRIPPED_CONTEXT_FIELDS}
    principal = out.get("principal")
    if isinstance(principal, Mapping):
        out["principal"] = {
            k: v for k, v in principal.items() if k not in PROJECTED_PRINCIPAL_FIELDS
        }
    return out
