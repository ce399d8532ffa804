"""Responses checked against the served OpenAPI description, for every HTTP test of the real app.

``tests/conftest.py`` wraps each ``aiohttp_client`` so that, after every request to an
application built by ``create_app``, the response is looked up by method and route template in
the description and must conform: a documented status, a documented content type, a body that
validates against the schema for that status, and the documented (required) headers.

Paths that are not in the description (private probe routes a test adds) are skipped here; the
parity test in ``tests/contract`` is what fails on a route missing from the description.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from service.api.openapi import description

__all__ = ["Contract", "Operation", "check_response", "contract", "is_real_app", "watch"]

_URI = "urn:controlplane:openapi"
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


@dataclass(frozen=True)
class Operation:
    method: str  # upper case
    template: str
    spec: dict[str, Any]


class Contract:
    """The served description, indexed by route template, with schema validation at hand."""

    def __init__(self, doc: dict[str, Any]):
        self.doc = doc
        self._registry = Registry().with_resource(_URI, Resource(contents=doc, specification=DRAFT202012))
        self._paths: list[tuple[re.Pattern[str], str]] = [
            (re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(t)) + "$"), t)
            for t in doc["paths"]
        ]

    def operations(self) -> list[Operation]:
        return [
            Operation(method.upper(), template, spec)
            for template, item in self.doc["paths"].items()
            for method, spec in item.items()
            if method in HTTP_METHODS
        ]

    def template_for(self, path: str) -> str | None:
        for pattern, template in self._paths:
            if pattern.match(path):
                return template
        return None

    def resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        """Follow a local ``$ref`` (responses, headers, parameters)."""
        while "$ref" in node:
            target: Any = self.doc
            for part in node["$ref"].removeprefix("#/").split("/"):
                target = target[part.replace("~1", "/").replace("~0", "~")]
            node = target
        return node

    def validator(self, schema: dict[str, Any]) -> Draft202012Validator:
        # The schema is embedded in a wrapper whose base is the description, so the schema's
        # "#/components/..." references resolve against the whole document.
        return _validator(self, json.dumps(schema, sort_keys=True))


@functools.cache
def _validator(contract: Contract, schema_json: str) -> Draft202012Validator:
    # Local "#/components/..." references become absolute ones into the registered description,
    # where the references inside it resolve against the whole document as their base.
    return Draft202012Validator(_rebase(json.loads(schema_json)), registry=contract._registry)


def _rebase(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (_URI + v if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rebase(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_rebase(item) for item in node]
    return node


@functools.cache
def contract() -> Contract:
    return Contract(description())


def _media_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def check_response(
    method: str, path: str, status: int, headers: Any, content_type: str | None, body: bytes
) -> list[str]:
    """Every way this response contradicts the description (empty when it conforms).

    A path the description does not know is not checked here (see the module docstring).
    """
    c = contract()
    method = method.upper()
    template = c.template_for(path)
    if template is None or method == "HEAD":
        return []
    where = f"{method} {path} -> {status}"
    item = c.doc["paths"][template]
    spec = item.get(method.lower())
    if spec is None:
        if status != 405:
            return [f"{where}: {method} is not described for {template}, and the answer is not 405"]
        response = c.resolve(c.doc["components"]["responses"]["MethodNotAllowed"])
    else:
        responses = spec["responses"]
        raw = responses.get(str(status)) or responses.get(f"{str(status)[0]}XX") or responses.get("default")
        if raw is None:
            return [f"{where}: status {status} is not described for {method} {template} "
                    f"(described: {', '.join(sorted(responses))})"]
        response = c.resolve(raw)
    errors: list[str] = []
    for name, header in (response.get("headers") or {}).items():
        header = c.resolve(header)
        value = headers.get(name)
        if value is None:
            if header.get("required"):
                errors.append(f"{where}: required header {name} is missing")
            continue
        for problem in c.validator(header.get("schema", {})).iter_errors(value):
            errors.append(f"{where}: header {name}={value!r}: {problem.message}")
    content = response.get("content")
    if not content:
        if body:
            errors.append(f"{where}: a body where the description has none")
        return errors
    media = _media_type(content_type)
    if media not in content:
        described = ", ".join(content)
        return [*errors, f"{where}: content type {media!r} is not described (described: {described})"]
    if not (media == "application/json" or media.endswith("+json")):
        return errors
    try:
        document = json.loads(body)
    except ValueError:
        return [*errors, f"{where}: the body is not JSON"]
    schema = content[media].get("schema", {})
    for problem in sorted(c.validator(schema).iter_errors(document), key=lambda e: list(e.absolute_path)):
        pointer = "/" + "/".join(str(p) for p in problem.absolute_path)
        errors.append(f"{where}: body at {pointer!r}: {problem.message[:300]}")
    return errors


def is_real_app(client: TestClient) -> bool:
    """Only applications built by ``create_app`` serve the description's routes."""
    app = getattr(client.server, "app", None)
    return app is not None and any(
        getattr(r, "canonical", None) == "/api/v1/openapi.json" for r in app.router.resources()
    )


def watch(client: TestClient) -> TestClient:
    """Make every response ``client`` receives from the real app a checked one."""
    if getattr(client, "_contract_watched", False) or not is_real_app(client):
        return client
    original = client._request

    async def _request(method: str, path: Any, **kwargs: Any) -> ClientResponse:
        response = await original(method, path, **kwargs)
        if _media_type(response.headers.get("Content-Type")) == "text/event-stream":
            body = b""  # a live stream: reading it here would wait for its end
            errors = check_response(method, response.url.path, response.status, response.headers,
                                    response.headers.get("Content-Type"), body)
            errors = [e for e in errors if "body" not in e]
        else:
            body = await response.read()  # cached: the test can still read it
            errors = check_response(method, response.url.path, response.status, response.headers,
                                    response.headers.get("Content-Type"), body)
        if errors:
            raise AssertionError("response contradicts schemas/openapi.yaml:\n  " + "\n  ".join(errors))
        return response

    client._request = _request  # type: ignore[method-assign]
    client._contract_watched = True  # type: ignore[attr-defined]
    return client
