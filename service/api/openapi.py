"""The API description: ``schemas/openapi.yaml`` served as self-contained JSON.

The YAML file refers to the request-body JSON Schemas in ``schemas/`` by file name (so editors
and offline tools resolve them beside it). Served as JSON, such references would point nowhere,
so at serve time every referenced file is bundled under ``components/schemas`` (named in
CamelCase after the file: ``approval-request.schema.json`` -> ``ApprovalRequest``), its own
``$id``/``$schema`` dropped and every reference, inside it too, rewritten to a local pointer.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import yaml
from aiohttp import web

from ..chain import public
from ..schemas import SCHEMA_DIR

__all__ = ["DESCRIPTION_PATH", "component_name", "description"]

routes = web.RouteTableDef()

DESCRIPTION_PATH = SCHEMA_DIR / "openapi.yaml"
_COMPONENTS = "#/components/schemas/"


def component_name(filename: str) -> str:
    """``approval-request.schema.json`` -> ``ApprovalRequest``."""
    stem = filename.removesuffix(".json").removesuffix(".schema")
    return "".join(part.capitalize() for part in stem.replace("_", "-").split("-") if part)


def _split(ref: str) -> tuple[str, str]:
    filename, _, fragment = ref.partition("#")
    return filename, fragment


def _rewrite(node: Any, *, base: str | None, pending: list[str]) -> Any:
    """Rewrite references in ``node``; ``base`` is the component a file's local refs live in."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                filename, fragment = _split(value)
                if filename:  # another file in schemas/
                    pending.append(filename)
                    out[key] = _COMPONENTS + component_name(filename) + fragment
                elif base is not None:  # a file's own "#/$defs/..." now lives under its component
                    out[key] = _COMPONENTS + base + fragment
                else:
                    out[key] = value
            else:
                out[key] = _rewrite(value, base=base, pending=pending)
        return out
    if isinstance(node, list):
        return [_rewrite(item, base=base, pending=pending) for item in node]
    return node


@functools.cache
def _bundled() -> dict[str, Any]:
    source = yaml.safe_load(DESCRIPTION_PATH.read_text(encoding="utf-8"))
    pending: list[str] = []
    doc: dict[str, Any] = _rewrite(source, base=None, pending=pending)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    done: set[str] = set()
    while pending:
        filename = pending.pop()
        if filename in done:
            continue
        done.add(filename)
        name = component_name(filename)
        if name in schemas:
            raise ValueError(f"{filename} would replace the component {name!r} of openapi.yaml")
        contents = json.loads((SCHEMA_DIR / filename).read_text(encoding="utf-8"))
        # The document's dialect (OpenAPI 3.1 = JSON Schema 2020-12) applies; an $id would
        # re-base the rewritten pointers, so both go.
        contents.pop("$id", None)
        contents.pop("$schema", None)
        schemas[name] = _rewrite(contents, base=name, pending=pending)
    return doc


def description() -> dict[str, Any]:
    """The served description (a fresh copy: callers may not change the cached one)."""
    return copy.deepcopy(_bundled())


@routes.get("/api/v1/openapi.json")
@public
async def openapi(request: web.Request) -> web.Response:
    """This service's OpenAPI 3.1 description, self-contained."""
    return web.json_response(_bundled())
