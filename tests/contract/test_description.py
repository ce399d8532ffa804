"""schemas/openapi.yaml against the application: route parity, the served document, conventions."""

from __future__ import annotations

import re
from typing import Any

import yaml

from service.api.openapi import DESCRIPTION_PATH, component_name, description
from service.app import create_app
from tests.contract_hooks import HTTP_METHODS, Contract


def _walk(node: Any, path: tuple[str, ...] = ()) -> Any:
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*path, key), key, value
            yield from _walk(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, (*path, str(index)))


def _template(canonical: str) -> str:
    # aiohttp writes {id} like OpenAPI does; a regex variable ({id:\d+}) keeps only its name.
    return re.sub(r"\{([^}:]+)(:[^}]*)?\}", r"{\1}", canonical)


def test_every_route_is_described_and_every_description_is_a_route(make_config):
    """Method + path template parity, both ways (HEAD is implied by every GET). The console's
    HTML pages (service/console) are for browsers, not part of the API description."""
    app = create_app(make_config())
    routes = {
        (route.method, _template(route.resource.canonical))
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
        and getattr(route.handler, "console_actions", None) is None
    }
    described = {
        (method.upper(), path)
        for path, item in description()["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }
    assert sorted(routes - described) == [], "routes missing from schemas/openapi.yaml"
    assert sorted(described - routes) == [], "described operations the app does not serve"


async def test_served_description_is_the_bundled_file(client):
    response = await client.get("/api/v1/openapi.json")
    assert response.status == 200
    assert response.content_type == "application/json"
    served = await response.json()
    assert served == description()
    assert served["openapi"] == "3.1.0"


def test_served_description_is_self_contained():
    """Every $ref is local and resolves; each referenced schemas/ file is bundled once."""
    doc = description()
    contract = Contract(doc)
    for path, key, value in _walk(doc):
        if key == "$ref":
            assert value.startswith("#/"), (path, value)
            contract.resolve({"$ref": value})
    source = yaml.safe_load(DESCRIPTION_PATH.read_text())
    files = {v.partition("#")[0] for _, k, v in _walk(source) if k == "$ref" and not v.startswith("#")}
    assert files, "request bodies are referenced from schemas/ by file name"
    for filename in files:
        bundled = doc["components"]["schemas"][component_name(filename)]
        assert "$id" not in bundled and "$schema" not in bundled


def test_every_response_documents_its_headers():
    """X-Correlation-ID everywhere; WWW-Authenticate on 401, Retry-After on 429, Allow on 405."""
    contract = Contract(description())
    responses = [
        (f"{op.method} {op.template} {status}", status, contract.resolve(raw))
        for op in contract.operations()
        for status, raw in op.spec["responses"].items()
    ]
    not_allowed = contract.resolve({"$ref": "#/components/responses/MethodNotAllowed"})
    responses.append(("any 405", "405", not_allowed))
    required = {"401": "WWW-Authenticate", "429": "Retry-After", "405": "Allow", "410": "Deprecation"}
    for where, status, response in responses:
        headers = {name: contract.resolve(h) for name, h in (response.get("headers") or {}).items()}
        assert headers.get("X-Correlation-ID", {}).get("required"), where
        if status in required:
            assert headers.get(required[status], {}).get("required"), where
        if status.startswith(("4", "5")):
            assert list(response["content"]) == ["application/problem+json"], where
            schema = response["content"]["application/problem+json"]["schema"]
            assert "#/components/schemas/Problem" in str(schema) or "LegacyOnlyProblem" in str(schema), where


def test_protected_operations_declare_bearer_and_public_ones_do_not(make_config):
    app = create_app(make_config())
    protected = {
        (route.method, _template(route.resource.canonical))
        for route in app.router.routes()
        if route.resource is not None and getattr(route.handler, "protection", None) is not None
    }
    for op in Contract(description()).operations():
        if (op.method, op.template) in protected:
            assert op.spec.get("security") == [{"bearer": []}], op
            assert {"401", "403", "503"} <= op.spec["responses"].keys(), op


def test_every_problem_code_the_service_raises_is_described():
    """Codes are constants listed in the description: each literal code= in the handlers,
    the chain and the error table appears in some response's code enum."""
    from pathlib import Path

    from service import errors
    from service.authn import errors as authn_errors

    root = Path(errors.__file__).parent
    sources = [root / "chain.py", root / "errors.py", *sorted((root / "api").glob("*.py"))]
    raised = {m for p in sources for m in re.findall(r'code="([a-z_]+)"', p.read_text())}
    raised |= {cls.code for cls in vars(authn_errors).values()
               if isinstance(cls, type) and issubclass(cls, authn_errors.InvalidToken)}
    raised |= {"self_review", "reviewer_not_human", "duplicate_review", "reviewer_role_required",
               "reviewer_group_required", "otp_invalid", "invalid_credentials", "step_up_not_available",
               "step_up_required", "approval_required", "denied", "ticket_binding_mismatch",
               "malformed_json", "method_not_allowed", "payload_too_large", "unsupported_media_type",
               "schema_validation_failed", "legacy_only", "not_found"}
    described: set[str] = set()
    for _, key, value in _walk(description()):
        if key in ("enum", "const") and key and isinstance(value, (list, str)):
            described |= set(value if isinstance(value, list) else [value])
    assert sorted(raised - described) == []
