r"""JSON Schemas from ``schemas/``: loaded once into a registry, validated with ``jsonschema``.

``pattern`` is matched as JSON Schema defines it (ECMA-262), not as Python's ``re.search``
would: ``$`` is the end of the string only (Python's also matches before a final newline, so
``^[a-z]+$`` took ``"abc\n"``), and ``\d``/``\w`` are ASCII. Every anchored id pattern is so
a full match of the whole value, on the server whatever the schema text's dialect quirks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource

from .schema_accept import SCHEMA_DIR, accepts, ecma_regex

__all__ = ["SCHEMA_DIR", "SchemaViolation", "ValidationFailed", "ecma_regex", "validate",
           "validator"]



@dataclass(frozen=True)
class SchemaViolation:
    """One failed constraint: where (a JSON pointer into the document) and what."""

    pointer: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"pointer": self.pointer, "message": self.message}


class ValidationFailed(Exception):
    """A document does not match its schema; ``violations`` lists every failed constraint."""

    def __init__(self, schema: str, violations: list[SchemaViolation]):
        super().__init__(f"{schema}: {len(violations)} violation(s)")
        self.schema = schema
        self.violations = violations


@functools.cache
def _registry() -> Registry:
    resources = []
    for path in sorted(SCHEMA_DIR.glob("*.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        resource = Resource.from_contents(contents)
        resources.append((path.name, resource))
        if "$id" in contents and contents["$id"] != path.name:
            resources.append((contents["$id"], resource))
    return Registry().with_resources(resources)


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not ecma_regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


#: Draft 2020-12 with ``pattern`` matched as ECMA-262 does (see the module docstring).
Validator = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, {"pattern": _pattern}
)


@functools.cache
def validator(name: str, *, check_schema: bool = True) -> Draft202012Validator:
    """The compiled validator of ``schemas/<name>`` (cached for the process lifetime).

    ``check_schema=False`` skips checking the schema against the 2020-12 metaschema (~0.1-0.2 s
    for compose-import): for a short-lived process (``cpctl compose check``) validating with
    the repository's own schema, which the tests check."""
    schema = _registry().contents(name)
    if check_schema:
        Draft202012Validator.check_schema(schema)
    return Validator(schema, registry=_registry())  # type: ignore[no-any-return]


def validate(name: str, document: Any, *, limit: int = 50, check_schema: bool = True) -> None:
    """Raise ``ValidationFailed`` listing JSON-pointer paths when ``document`` fails ``name``
    (``check_schema``: see ``validator``)."""
    checked = validator(name, check_schema=check_schema)  # (the schema itself checked once)
    if accepts(name, document):
        # Certainly valid (exact where it says so): the request bodies, without jsonschema's
        # walk (~40 us for an installer action's body; ``service.schema_accept``).
        return
    errors = sorted(checked.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        # dict.fromkeys keeps order and drops repeats (one "required" error per missing key).
        violations = list(dict.fromkeys(v for error in errors for v in _flatten(error)))
        raise ValidationFailed(name, violations[:limit])


def _flatten(error: ValidationError) -> Iterator[SchemaViolation]:
    # oneOf/anyOf failures carry their real reasons in .context; report the leaves.
    if error.context and error.validator in ("oneOf", "anyOf"):
        pointer = _pointer(error.absolute_path)
        yield SchemaViolation(pointer, _message(error))
        return
    yield SchemaViolation(_pointer(error.absolute_path), _message(error))


def _message(error: ValidationError) -> str:
    # jsonschema messages quote the offending instance, which may be large or sensitive
    # (a password in a wrong-type field): describe the constraint instead.
    validator_name = str(error.validator)
    value: Any = error.validator_value
    if validator_name == "required":
        missing = [p for p in value if isinstance(error.instance, dict) and p not in error.instance]
        return f"missing required property: {', '.join(missing) or '?'}"
    if validator_name == "additionalProperties" and isinstance(error.instance, dict):
        schema: Any = error.schema
        allowed = set((schema.get("properties") or {}).keys())
        extra = sorted(k for k in error.instance if k not in allowed)
        return f"unknown property: {', '.join(extra[:10])}"
    if validator_name == "type":
        return f"must be of type {value}"
    if validator_name == "enum":
        return f"must be one of {json.dumps(value)[:300]}"
    if validator_name == "const":
        return f"must be {json.dumps(value)[:300]}"
    if validator_name in ("minLength", "maxLength", "minimum", "maximum", "minItems",
                          "maxItems", "minProperties", "maxProperties",
                          "exclusiveMinimum", "exclusiveMaximum"):
        return f"violates {validator_name}={value}"
    if validator_name == "pattern":
        return f"must match pattern {value}"
    if validator_name == "format":
        return f"must be a valid {value}"
    return f"violates {validator_name}"


def _pointer(path: Any) -> str:
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return "/" + "/".join(parts) if parts else ""
