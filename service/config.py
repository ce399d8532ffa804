"""Configuration: read once at the edge — defaults < YAML file < ``CONTROLPLANE_*`` environment.

The default needs nothing: embedded mode on 127.0.0.1:8700, SQLite under ``./.state``, the
repository's ``policies/``, dev identities from ``examples/identities.yaml``. The raw document is
checked against ``schemas/config.schema.json`` before it becomes frozen dataclasses, so a typo in a
key is an error at start-up rather than a silently ignored setting. Nothing else in the service
reads ``os.environ``.

Environment overrides: ``CONTROLPLANE_HOST``, ``CONTROLPLANE_PORT``, ``CONTROLPLANE_WORKERS``,
``CONTROLPLANE_STATE_DIR`` are shorthands; any other key is addressed with double underscores,
e.g. ``CONTROLPLANE_STORE__POSTGRES__DSN`` or ``CONTROLPLANE_STORE__BACKEND=postgres``. Values are
parsed as YAML scalars (``8701`` is an int, ``true`` a bool).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from .schemas import ValidationFailed, validate

__all__ = [
    "Config",
    "ConfigError",
    "DatabaseItem",
    "Secret",
    "StorageItem",
    "load",
]

ENV_PREFIX = "CONTROLPLANE_"
_SHORTHANDS = {
    "HOST": ("server", "host"),
    "PORT": ("server", "port"),
    "WORKERS": ("server", "workers"),
    "STATE_DIR": ("state_dir",),
    "MODE": ("mode",),
}
# Variables that are not configuration keys (read by tests and tooling, not by the service).
_NOT_CONFIG = {"CONFIG", "CREDENTIALS", "TEST_PG_DSN", "TOKEN", "URL"}

_REPO_ROOT = Path(__file__).resolve().parent.parent

DEFAULTS: dict[str, Any] = {
    "mode": "embedded",
    "state_dir": ".state",
    "server": {
        "host": "127.0.0.1",
        "port": 8700,
        "workers": 1,
        "max_body_bytes": 1024 * 1024,
        "shutdown_timeout_s": 10,
    },
    "store": {"backend": "sqlite", "sqlite": {"path": None}, "postgres": {"dsn": None, "schema": None}},
    "policies": {"dir": "policies", "reload_interval_s": 2},
    "environments": {
        "dev": {"production": False},
        "staging": {"production": False},
        "prod": {"production": True},
    },
    "authn": {
        "issuer": "urn:controlplane:local",
        "audience": "urn:controlplane:api",
        "identities": "examples/identities.yaml",
        "token_ttl_s": 900,
        "step_up_window_s": 300,
        "clock_skew_s": 30,
        "session_ttl_s": 28800,
        "max_failures": 5,
        "failure_window_s": 300,
    },
    "approvals": {"store": "default", "default_ttl_s": 900, "pending_ttl_s": 86400},
    "audit": {"jsonl_path": None},
    "logging": {"level": "INFO", "access_log": True, "mask_fields": []},
    "inventory": {"databases": [], "storage": []},
}


class ConfigError(Exception):
    """The configuration cannot be loaded; the message says where and why (never a secret)."""


class Secret:
    """A configuration value that must never be printed: ``repr``/``str`` give ``***``."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        """The secret itself, for the one place that needs it (e.g. opening a connection)."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class ServerConfig:
    host: str
    port: int
    workers: int
    max_body_bytes: int
    shutdown_timeout_s: float


@dataclass(frozen=True)
class StoreConfig:
    backend: str  # sqlite | postgres | none
    sqlite_path: Path
    postgres_dsn: Secret | None
    postgres_schema: str | None

    @property
    def url(self) -> Secret | None:
        """The store URL for ``open_store`` (a Secret: a DSN may carry a password)."""
        if self.backend == "sqlite":
            return Secret(f"sqlite:///{self.sqlite_path}")
        if self.backend == "postgres" and self.postgres_dsn is not None:
            return self.postgres_dsn
        return None


@dataclass(frozen=True)
class PoliciesConfig:
    dir: Path
    reload_interval_s: float


@dataclass(frozen=True)
class AuthnConfig:
    issuer: str
    audience: str
    identities: Path
    token_ttl_s: int
    step_up_window_s: int
    clock_skew_s: int
    session_ttl_s: int
    max_failures: int
    failure_window_s: int


@dataclass(frozen=True)
class ApprovalsConfig:
    enabled: bool
    default_ttl_s: int
    pending_ttl_s: int


@dataclass(frozen=True)
class LoggingConfig:
    level: str
    access_log: bool
    mask_fields: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class _InventoryItem:
    """What every inventory entry shows; credential references are never kept."""

    name: str
    env: str
    region: str | None = None
    description: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """The wire form: every kept field (credentials were dropped at load)."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["tags"] = dict(self.tags)
        return doc


@dataclass(frozen=True, kw_only=True)
class DatabaseItem(_InventoryItem):
    """One database in the read-only inventory."""

    engine: str


@dataclass(frozen=True, kw_only=True)
class StorageItem(_InventoryItem):
    """One object-storage location in the read-only inventory."""

    provider: str


@dataclass(frozen=True)
class InventoryConfig:
    databases: tuple[DatabaseItem, ...] | None  # None: no inventory configured
    storage: tuple[StorageItem, ...] | None


@dataclass(frozen=True)
class Config:
    """The whole, validated configuration. Build it with ``load``."""

    mode: str
    state_dir: Path
    server: ServerConfig
    store: StoreConfig
    policies: PoliciesConfig
    environments: Mapping[str, bool]  # env name -> production?
    authn: AuthnConfig
    approvals: ApprovalsConfig
    audit_jsonl_path: Path | None
    logging: LoggingConfig
    inventory: InventoryConfig
    source: str | None = None  # the file it came from, for messages

    def is_production(self, env: str) -> bool:
        """Unknown environments count as production: fail closed."""
        return self.environments.get(env, True)

    @property
    def runtime_mode(self) -> str:
        """``embedded-sqlite``, ``postgresql`` or ``stateless`` (no store)."""
        return {"sqlite": "embedded-sqlite", "postgres": "postgresql"}.get(
            self.store.backend, "stateless"
        )


def load(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    base_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Load the configuration: defaults < YAML file at ``path`` < ``environ`` < ``overrides``.

    Relative paths in the file are resolved against ``base_dir`` (default: the current
    directory, the way ``cpctl serve`` is run from a checkout).
    """
    raw = copy.deepcopy(DEFAULTS)
    source = None
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}: not valid YAML{where}") from None
        if document is None:
            document = {}
        if not isinstance(document, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        _check(document, source)
        _merge(raw, document)
    env_doc = _from_environ(environ or {})
    _merge(raw, env_doc)
    if overrides:
        _merge(raw, copy.deepcopy(dict(overrides)))
    _check(raw, source or "configuration")
    return _build(raw, base_dir or Path.cwd(), source)


def _check(document: dict[str, Any], source: str | None) -> None:
    try:
        validate("config.schema.json", document)
    except ValidationFailed as exc:
        details = "; ".join(f"{v.pointer or '/'}: {v.message}" for v in exc.violations)
        raise ConfigError(f"{source or 'configuration'}: {details}") from None


def _merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict) and key != "environments":
            _merge(into[key], value)
        else:
            into[key] = value


def _from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for name, text in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX):]
        if key in _NOT_CONFIG or key.startswith("TEST_"):
            continue
        path = _SHORTHANDS.get(key) or tuple(part.lower() for part in key.split("__"))
        try:
            value = yaml.safe_load(text) if text != "" else None
        except yaml.YAMLError:
            value = text
        if isinstance(value, (dict, list)):
            value = text  # structured values only come from the file
        node = document
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: conflicts with another CONTROLPLANE_ variable")
        node[path[-1]] = value
    return document


def _build(raw: dict[str, Any], base: Path, source: str | None) -> Config:
    def resolve(value: str) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else (base / p)

    state_dir = resolve(raw["state_dir"])
    server = raw["server"]
    store = raw["store"]
    sqlite_path = store["sqlite"].get("path")
    dsn = store["postgres"].get("dsn")
    if store["backend"] == "postgres":
        if not dsn:
            raise ConfigError("store.backend is postgres but store.postgres.dsn is not set")
        scheme = urlsplit(dsn).scheme
        if scheme not in ("postgres", "postgresql"):
            raise ConfigError("store.postgres.dsn must be a postgresql:// URL")
    authn = raw["authn"]
    approvals = raw["approvals"]
    inventory = raw["inventory"]
    logging_raw = raw["logging"]
    return Config(
        mode=raw["mode"],
        state_dir=state_dir,
        server=ServerConfig(
            host=server["host"],
            port=int(server["port"]),
            workers=int(server["workers"]),
            max_body_bytes=int(server["max_body_bytes"]),
            shutdown_timeout_s=float(server["shutdown_timeout_s"]),
        ),
        store=StoreConfig(
            backend=store["backend"],
            sqlite_path=resolve(sqlite_path) if sqlite_path else state_dir / "controlplane.db",
            postgres_dsn=Secret(dsn) if dsn else None,
            postgres_schema=store["postgres"].get("schema"),
        ),
        policies=PoliciesConfig(
            dir=resolve(raw["policies"]["dir"]),
            reload_interval_s=float(raw["policies"]["reload_interval_s"]),
        ),
        environments={name: bool(spec["production"]) for name, spec in raw["environments"].items()},
        authn=AuthnConfig(
            issuer=authn["issuer"],
            audience=authn["audience"],
            identities=resolve(authn["identities"]),
            token_ttl_s=int(authn["token_ttl_s"]),
            step_up_window_s=int(authn["step_up_window_s"]),
            clock_skew_s=int(authn["clock_skew_s"]),
            session_ttl_s=int(authn["session_ttl_s"]),
            max_failures=int(authn["max_failures"]),
            failure_window_s=int(authn["failure_window_s"]),
        ),
        approvals=ApprovalsConfig(
            enabled=approvals["store"] != "none" and store["backend"] != "none",
            default_ttl_s=int(approvals["default_ttl_s"]),
            pending_ttl_s=int(approvals["pending_ttl_s"]),
        ),
        audit_jsonl_path=resolve(raw["audit"]["jsonl_path"]) if raw["audit"].get("jsonl_path") else None,
        logging=LoggingConfig(
            level=logging_raw["level"],
            access_log=bool(logging_raw["access_log"]),
            mask_fields=tuple(logging_raw["mask_fields"]),
        ),
        inventory=InventoryConfig(
            databases=_inventory(inventory.get("databases"), DatabaseItem, "engine"),
            storage=_inventory(inventory.get("storage"), StorageItem, "provider"),
        ),
        source=source,
    )


def _inventory(items: list[dict[str, Any]] | None, cls: Any, kind_key: str) -> Any:
    if not items:
        return None
    return tuple(
        cls(
            name=item["name"],
            env=item["env"],
            region=item.get("region"),
            description=item.get("description"),
            tags=dict(item.get("tags") or {}),
            **{kind_key: item[kind_key]},
        )
        for item in items
    )
