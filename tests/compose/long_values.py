"""Compose documents with one long string in every string position, for the regex-bound tests.

regopy's regular expressions recurse once per byte a repetition consumes, so a long value only
crashes a rule when it has the shape that rule's pattern repeats over: each ``SHAPES`` entry is
one such shape (a placeholder, a password hash, a credential-looking value, a device or image
name, ...). ``documents`` puts a value of each shape into each string position of a compose
file (schema-valid: a position whose pattern the value does not match is left out), packed into
as few documents as fit ``max_bytes``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

#: name -> (prefix, the repeated character, suffix)
SHAPES: dict[str, tuple[str, str, str]] = {
    "run": ("", "x", ""),
    "placeholder": ("<", "a", ">"),
    "your-here": ("your", "a", "here"),
    "argon2": ("$argon2id$", "a", ""),
    "url-credentials": ("https://user:", "p", "@host"),
    "jwt": ("eyJ", "a", ".eyJaaaaaaaaaaaa.sig"),
    "pem": ("-----BEGIN ", "A", "PRIVATE KEY-----"),
    "api-key": ("sk-", "a", ""),
    "device": ("/dev/sd", "a", ""),
    "tree": ("/etc/", "a", ""),
    "socket-proxy": ("", "a", "socket-proxy"),
}


def value(shape: str, length: int) -> str:
    """A string of about ``length`` characters of ``shape``."""
    prefix, fill, suffix = SHAPES[shape]
    return prefix + fill * max(0, length - len(prefix) - len(suffix)) + suffix


def base() -> dict[str, Any]:
    """A service that touches every rule: the positions below replace its strings."""
    return {
        "services": {"web": {
            "image": "nginx:1.27", "user": "1000", "network_mode": "bridge", "ipc": "private",
            "command": ["run"], "entrypoint": ["/bin/app"], "hostname": "web",
            "working_dir": "/app", "cgroup_parent": "cg", "userns_mode": "private",
            "cap_add": ["CHOWN"], "cap_drop": ["ALL"], "security_opt": ["no-new-privileges:true"],
            "ports": [{"target": 80, "published": "8080", "host_ip": "127.0.0.1",
                       "name": "http", "app_protocol": "http", "protocol": "tcp"}],
            "volumes": [{"type": "bind", "source": "/srv/app", "target": "/data"},
                        {"type": "volume", "source": "cache", "target": "/cache"}],
            "devices": [{"source": "/dev/fuse", "target": "/dev/fuse", "permissions": "rwm"}],
            "environment": {"LOG_LEVEL": "info", "APP_MODE": "prod",
                            "DB_PASSWORD": "hunter2hunter2"},
            "labels": {"team": "web", "tier": "front"}, "sysctls": {"net.core.somaxconn": "1024"},
            "secrets": [{"source": "db", "target": "db"}],
            "healthcheck": {"test": ["CMD", "/bin/true"]},
            "dns": ["10.0.0.1"], "restart": "on-failure",
            "logging": {"driver": "json-file", "options": {"max-size": "10m"}},
        }},
        "volumes": {"cache": {"driver_opts": {"type": "none", "o": "bind", "device": "/srv/c"}}},
        "secrets": {"db": {"file": "./db.txt"}},
        "networks": {"backend": {"internal": True}},
    }


def _set(*path: Any) -> Callable[[dict[str, Any], str], None]:
    def put(doc: dict[str, Any], text: str) -> None:
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = text
    return put


def _rename(*path: Any) -> Callable[[dict[str, Any], str], None]:
    """The last key of ``path`` becomes ``text`` (a map key position)."""
    def put(doc: dict[str, Any], text: str) -> None:
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[text] = node.pop(path[-1])
    return put


_SVC = ("services", "web")
_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")

#: name -> (how to put a string there, the pattern the schema holds it to, if any)
POSITIONS: dict[str, tuple[Callable[[dict[str, Any], str], None], re.Pattern[str] | None]] = {
    "service-name": (_rename("services", "web"), _NAME),
    **{f"service.{key}": (_set(*_SVC, key), None) for key in (
        "image", "user", "network_mode", "ipc", "hostname", "working_dir", "cgroup_parent",
        "userns_mode", "pid", "cgroup")},
    "command": (_set(*_SVC, "command", 0), None),
    "entrypoint": (_set(*_SVC, "entrypoint", 0), None),
    "cap_add": (_set(*_SVC, "cap_add", 0), None),
    "cap_drop": (_set(*_SVC, "cap_drop", 0), None),
    "security_opt": (_set(*_SVC, "security_opt", 0), None),
    "ports.host_ip": (_set(*_SVC, "ports", 0, "host_ip"), None),
    "ports.name": (_set(*_SVC, "ports", 0, "name"), None),
    "ports.app_protocol": (_set(*_SVC, "ports", 0, "app_protocol"), None),
    "bind.source": (_set(*_SVC, "volumes", 0, "source"), None),
    "bind.target": (_set(*_SVC, "volumes", 0, "target"), None),
    "volume.target": (_set(*_SVC, "volumes", 1, "target"), None),
    "devices.source": (_set(*_SVC, "devices", 0, "source"), None),
    "devices.target": (_set(*_SVC, "devices", 0, "target"), None),
    "environment.key": (_rename(*_SVC, "environment", "LOG_LEVEL"), None),
    "environment.value": (_set(*_SVC, "environment", "APP_MODE"), None),
    "environment.secret-value": (_set(*_SVC, "environment", "DB_PASSWORD"), None),
    "labels.key": (_rename(*_SVC, "labels", "team"), None),
    "labels.value": (_set(*_SVC, "labels", "tier"), None),
    "sysctls.value": (_set(*_SVC, "sysctls", "net.core.somaxconn"), None),
    "secrets.target": (_set(*_SVC, "secrets", 0, "target"), None),
    "healthcheck.test": (_set(*_SVC, "healthcheck", "test", 1), None),
    "dns": (_set(*_SVC, "dns", 0), None),
    "logging.option": (_set(*_SVC, "logging", "options", "max-size"), None),
    "volume.device": (_set("volumes", "cache", "driver_opts", "device"), None),
    "volume.name": (_rename("volumes", "cache"), None),
    "network.name": (_rename("networks", "backend"), None),
}


def every_pair() -> list[tuple[str, str]]:
    """Every shape in every position."""
    return [(shape, position) for shape in SHAPES for position in POSITIONS]


def rotation() -> list[tuple[str, str]]:
    """Every position once, the shapes taken in turn (for lengths where every pair would cost
    too much: the rules' length bounds do not depend on the shape)."""
    shapes = list(SHAPES)
    return [(shapes[i % len(shapes)], position) for i, position in enumerate(POSITIONS)]


def documents(length: int, max_bytes: int, pairs: list[tuple[str, str]]
              ) -> Iterator[tuple[list[str], dict[str, Any]]]:
    """(the ``shape@position`` ids in it, the fields) for each (shape, position) of ``pairs``
    at ``length`` characters, as few documents as fit ``max_bytes`` of JSON each (one long
    value per position and document)."""
    pending = list(pairs)
    while pending:
        ids: list[str] = []
        puts: dict[str, str] = {}
        used, rest = len(json.dumps(base())), []
        for shape, position in pending:
            text = value(shape, length)
            pattern = POSITIONS[position][1]
            if pattern is not None and not pattern.match(text):
                continue
            if position in puts or (ids and used + len(text) > max_bytes):
                rest.append((shape, position))
                continue
            puts[position] = text
            used += len(json.dumps(text))
            ids.append(f"{shape}@{position}")
        doc = base()
        # The service's own name last: the other positions find it under its first name.
        for position in sorted(puts, key=lambda name: name == "service-name"):
            POSITIONS[position][0](doc, puts[position])
        yield ids, doc
        pending = rest
