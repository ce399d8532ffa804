"""schemas/compose-import.schema.json: bad bodies fail at the right JSON pointers (422 paths)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from service.schemas import ValidationFailed, validate, validator

SCHEMA = "compose-import.schema.json"
GOOD: dict[str, Any] = {
    "fields": {
        "name": "shop",
        "services": {
            "web": {
                "image": "nginx:1.27",
                "ports": [{"target": 80, "published": "8080", "host_ip": "127.0.0.1",
                           "protocol": "tcp", "mode": "ingress"}],
                "volumes": [{"type": "bind", "source": "./html", "target": "/usr/share/nginx/html",
                             "read_only": True}],
                "environment": {"A": "1", "B": None},
                "deploy": {"resources": {"limits": {"cpus": 0.5, "memory": 134217728}}},
                "healthcheck": {"test": ["CMD", "true"], "interval": "10s", "retries": 3},
            }
        },
        "volumes": {"data": {}},
    },
    "strict": True,
    "env": "prod",
}


def pointers(body: Any) -> set[str]:
    with pytest.raises(ValidationFailed) as info:
        validate(SCHEMA, body)
    return {v.pointer for v in info.value.violations}


def with_change(path: str, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(GOOD)
    *parents, last = path.strip("/").split("/")
    node = body
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is _DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return body


_DELETE = object()


def test_schema_is_valid_draft_2020_12_and_accepts_a_good_body() -> None:
    Draft202012Validator.check_schema(validator(SCHEMA).schema)
    assert validator(SCHEMA).schema["$schema"].endswith("2020-12/schema")
    validate(SCHEMA, GOOD)
    validate(SCHEMA, {"fields": {"services": {}}})


@pytest.mark.parametrize(("path", "value", "pointer"), [
    pytest.param("/fields", _DELETE, "", id="fields-required"),
    pytest.param("/extra", 1, "", id="top-level-additional"),
    pytest.param("/strict", "yes", "/strict", id="strict-bool"),
    pytest.param("/env", "", "/env", id="env-empty"),
    pytest.param("/env", "prod env", "/env", id="env-pattern"),
    pytest.param("/fields/services", _DELETE, "/fields", id="services-required"),
    pytest.param("/fields/x-anchors", {"a": 1}, "/fields", id="top-level-x"),
    pytest.param("/fields/version", "3.8", "/fields", id="version-not-normalized"),
    pytest.param("/fields/services/web/x-note", "a", "/fields/services/web", id="service-x"),
    pytest.param("/fields/services/web/priviledged", True, "/fields/services/web", id="typo"),
    pytest.param("/fields/services/web/privileged", "true", "/fields/services/web/privileged",
                 id="privileged-string"),
    pytest.param("/fields/services/web/ports/0", "8080:80", "/fields/services/web/ports/0",
                 id="short-port"),
    pytest.param("/fields/services/web/ports/0/published", 8080,
                 "/fields/services/web/ports/0/published", id="published-int"),
    pytest.param("/fields/services/web/ports/0/target", 70000,
                 "/fields/services/web/ports/0/target", id="target-range"),
    pytest.param("/fields/services/web/volumes/0", "./html:/usr/share/nginx/html",
                 "/fields/services/web/volumes/0", id="short-volume"),
    pytest.param("/fields/services/web/volumes/0/type", "nfs",
                 "/fields/services/web/volumes/0/type", id="volume-type"),
    pytest.param("/fields/services/web/environment", ["A=1"], "/fields/services/web/environment",
                 id="environment-list"),
    pytest.param("/fields/services/web/environment/A", 1, "/fields/services/web/environment/A",
                 id="environment-number"),
    pytest.param("/fields/services/web/command", "nginx -g", "/fields/services/web/command",
                 id="command-string"),
    pytest.param("/fields/services/web/deploy/resources/limits/memory", "512M",
                 "/fields/services/web/deploy/resources/limits/memory", id="memory-unparsed"),
    pytest.param("/fields/services/web/mem_limit", "1g", "/fields/services/web",
                 id="mem-limit-not-folded"),
    pytest.param("/fields/services/web/restart", "sometimes", "/fields/services/web/restart",
                 id="restart-enum"),
    pytest.param("/fields/services/web/healthcheck/test", "curl x",
                 "/fields/services/web/healthcheck/test", id="healthcheck-string"),
    pytest.param("/fields/services/web/env_file", ".env", "/fields/services/web/env_file",
                 id="env-file-short"),
    pytest.param("/fields/volumes/data", {"x-a": 1}, "/fields/volumes/data", id="volume-def-x"),
])
def test_bad_bodies_fail_at_the_pointer(path: str, value: Any, pointer: str) -> None:
    assert pointer in pointers(with_change(path, value))


def test_bad_service_name_and_non_object_body() -> None:
    body = copy.deepcopy(GOOD)
    body["fields"]["services"]["bad name"] = {"image": "a"}
    assert "/fields/services" in pointers(body)
    assert "" in pointers(["not", "an", "object"])
