"""Configuration: read once at the edge — defaults < YAML file < ``CONTROLPLANE_*`` environment.

The default needs nothing: embedded mode on 127.0.0.1:8700, SQLite under ``./.state``, the
repository's ``policies/``, dev identities from ``examples/identities.yaml``. The raw document is
checked against ``schemas/config.schema.json`` before it becomes frozen dataclasses, so a typo in a
key is an error at start-up rather than a silently ignored setting. Nothing else in the service
reads ``os.environ`` (``load_from_process`` is the door for commands started from a shell); the
CLI reads only its own client variables (``cli/client.py``: CONTROLPLANE_URL, _TOKEN,
_CREDENTIALS), and ``cpctl compose`` hands the shell environment to compose interpolation.

Environment overrides: ``CONTROLPLANE_HOST``, ``CONTROLPLANE_PORT``, ``CONTROLPLANE_WORKERS``,
``CONTROLPLANE_STATE_DIR`` are shorthands; any other key is addressed with double underscores,
e.g. ``CONTROLPLANE_STORE__POSTGRES__DSN`` or ``CONTROLPLANE_STORE__BACKEND=postgres``. Values are
parsed as YAML scalars (``8701`` is an int, ``true`` a bool).
"""

from __future__ import annotations

import copy
import os
import re
import string
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import yaml
from aiohttp import web

from .authn.tokens import MAX_ACCESS_TTL_S
from .notifications.signing import SignatureError, parse_secret
from .schemas import ValidationFailed, validate

__all__ = [
    "CONFIG",
    "AuditConfig",
    "AuthnConfig",
    "Config",
    "ConfigError",
    "DatabaseItem",
    "Environments",
    "FederationConfig",
    "NotificationsConfig",
    "OidcProvider",
    "Secret",
    "SinkConfig",
    "StorageItem",
    "WorkloadIssuer",
    "environment_variable",
    "load",
    "load_from_process",
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
_NOT_CONFIG = {"CONFIG", "CREDENTIALS", "TEST_PG_DSN", "TOKEN", "TOKEN_FILE", "URL"}

_REPO_ROOT = Path(__file__).resolve().parent.parent


def environment_variable(path: tuple[str, ...]) -> str:
    """The ``CONTROLPLANE_*`` variable that sets the key at ``path`` (its shorthand when it has
    one): what ``_from_environ`` reads, turned round, for the configuration reference."""
    for name, at in _SHORTHANDS.items():
        if at == path:
            return ENV_PREFIX + name
    return ENV_PREFIX + "__".join(part.upper() for part in path)


_Resolve = Callable[[str], Path]

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


class Environments(Mapping[str, bool]):
    """Environment name -> is it production. The one home of the environment rules."""

    __slots__ = ("_production", "_strictest")

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "dev": {"production": False},
        "staging": {"production": False},
        "prod": {"production": True},
    }

    def __init__(self, production: Mapping[str, bool]):
        if not production:
            raise ConfigError("environments: at least one environment is required")
        self._production = dict(production)
        # The first production environment (or, with none, the first configured): every
        # listing without an ``env`` is judged as it (``strictest``).
        self._strictest = next((name for name, prod in self._production.items() if prod),
                               next(iter(self._production)))

    def __getitem__(self, name: str) -> bool:
        return self._production[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._production)

    def __len__(self) -> int:
        return len(self._production)

    def __repr__(self) -> str:
        return f"Environments({self._production!r})"

    def is_production(self, env: str) -> bool:
        """Unknown environments count as production: fail closed."""
        return self._production.get(env, True)

    def strictest(self) -> str:
        """The environment a request spanning every environment is judged as: the first
        production one (or, with none, the first configured)."""
        return self._strictest

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> Environments:
        return cls({name: bool(spec["production"]) for name, spec in raw.items()})


@dataclass(frozen=True)
class StreamsConfig:
    """Live event streams (server-sent events): how many may be open, and how they are kept."""

    #: Open streams per worker, all principals together; one more is a 429 too_many_streams.
    max_total: int
    #: Open streams per worker for one principal (subject).
    max_per_principal: int
    #: A comment line is sent this often on every open stream.
    heartbeat_s: float
    #: The stream's session is checked again this often; a logged-out session ends it.
    session_check_s: float

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "max_total": 200,
        "max_per_principal": 5,
        "heartbeat_s": 15,
        "session_check_s": 2,
    }

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> StreamsConfig:
        return cls(
            max_total=int(raw["max_total"]),
            max_per_principal=int(raw["max_per_principal"]),
            heartbeat_s=float(raw["heartbeat_s"]),
            session_check_s=float(raw["session_check_s"]),
        )


@dataclass(frozen=True)
class ServerConfig:
    host: str
    port: int
    workers: int
    max_body_bytes: int
    shutdown_timeout_s: float
    #: A connection must send a complete request head within this many seconds of connecting
    #: (or of its previous response), or it is closed. Also the idle keep-alive timeout.
    header_timeout_s: float
    #: Header fields per request, and bytes of one request head (request line and fields).
    max_header_fields: int
    max_header_bytes: int
    streams: StreamsConfig
    #: The workers' event loop: ``auto`` (uvloop when it is installed, else asyncio's own),
    #: ``uvloop`` (it must be installed) or ``asyncio``.
    event_loop: str = "auto"

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "host": "127.0.0.1",
        "port": 8700,
        "workers": 1,
        "max_body_bytes": 1024 * 1024,
        "shutdown_timeout_s": 10,
        "header_timeout_s": 10,
        "max_header_fields": 100,
        "max_header_bytes": 256 * 1024,
        "streams": StreamsConfig.DEFAULTS,
        "event_loop": "auto",
    }

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> ServerConfig:
        return cls(
            host=raw["host"],
            port=int(raw["port"]),
            workers=int(raw["workers"]),
            max_body_bytes=int(raw["max_body_bytes"]),
            shutdown_timeout_s=float(raw["shutdown_timeout_s"]),
            header_timeout_s=float(raw["header_timeout_s"]),
            max_header_fields=int(raw["max_header_fields"]),
            max_header_bytes=int(raw["max_header_bytes"]),
            streams=StreamsConfig.from_raw(raw["streams"]),
            event_loop=str(raw["event_loop"]),
        )


@dataclass(frozen=True)
class StoreConfig:
    backend: str  # sqlite | postgres | none
    sqlite_path: Path
    postgres_dsn: Secret | None
    postgres_schema: str | None
    #: The deadline of every store call (a transaction, a ping, the wait for a group commit):
    #: past it the call fails with StoreUnavailable (503 store_unavailable).
    timeout_s: float = 5.0
    #: An unreachable store at start-up is fatal (exit 2) instead of degraded-and-retried.
    required: bool = False
    #: The bound of /readyz's store probe (and of the background status check).
    probe_timeout_s: float = 1.0
    #: A store call that failed (unavailable) this recently, with no call of its kind (read or
    #: write) succeeding since, makes the store degraded: /readyz 503.
    failure_window_s: float = 10.0

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "backend": "sqlite",
        "sqlite": {"path": None},
        "postgres": {"dsn": None, "schema": None},
        "timeout_s": 5,
        "required": False,
        "probe_timeout_s": 1,
        "failure_window_s": 10,
    }

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], resolve: _Resolve, state_dir: Path) -> StoreConfig:
        sqlite_path = raw["sqlite"].get("path")
        dsn = raw["postgres"].get("dsn")
        if raw["backend"] == "postgres":
            if not dsn:
                raise ConfigError("store.backend is postgres but store.postgres.dsn is not set")
            if urlsplit(dsn).scheme not in ("postgres", "postgresql"):
                raise ConfigError("store.postgres.dsn must be a postgresql:// URL")
        return cls(
            backend=raw["backend"],
            sqlite_path=resolve(sqlite_path) if sqlite_path else state_dir / "controlplane.db",
            postgres_dsn=Secret(dsn) if dsn else None,
            postgres_schema=raw["postgres"].get("schema"),
            timeout_s=float(raw["timeout_s"]),
            required=bool(raw["required"]),
            probe_timeout_s=float(raw["probe_timeout_s"]),
            failure_window_s=float(raw["failure_window_s"]),
        )

    @property
    def url(self) -> Secret | None:
        """The store URL for ``open_store`` (a Secret: a DSN may carry a password)."""
        if self.backend == "sqlite":
            return Secret(f"sqlite:///{self.sqlite_path}")
        if self.backend == "postgres" and self.postgres_dsn is not None:
            return self.postgres_dsn
        return None


@dataclass(frozen=True)
class PolicyStoreConfig:
    """``policies.store``: how a process follows the fleet's active revision in the store
    (``policies.source: store``) and which publishers' signatures it accepts."""

    #: PEM files of the Ed25519 public keys trusted to sign policy revisions.
    trusted_keys: tuple[Path, ...]
    #: How often the active revision is read (PostgreSQL also wakes replicas by NOTIFY).
    poll_interval_s: float
    #: A process that does not run the active revision this long after it noticed it (it was
    #: refused, or the store cannot be read) reports ``authz`` degraded.
    convergence_s: float
    #: PEM file of this replica's Ed25519 activation key: it signs the activations and
    #: rollbacks this replica executes (none: this replica answers them 503).
    activation_key: Path | None = None
    #: PEM files of the Ed25519 public keys whose activation signatures are accepted (the
    #: public half of ``activation_key`` is trusted as well).
    trusted_activation_keys: tuple[Path, ...] = ()

    DEFAULTS: ClassVar[dict[str, Any]] = {"trusted_keys": [], "poll_interval_s": 1,
                                          "convergence_s": 5, "activation_key": None,
                                          "trusted_activation_keys": []}

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], resolve: _Resolve) -> PolicyStoreConfig:
        key = raw.get("activation_key")
        out = cls(trusted_keys=tuple(resolve(p) for p in raw["trusted_keys"]),
                  poll_interval_s=float(raw["poll_interval_s"]),
                  convergence_s=float(raw["convergence_s"]),
                  activation_key=resolve(key) if key else None,
                  trusted_activation_keys=tuple(
                      resolve(p) for p in raw.get("trusted_activation_keys") or ()))
        if out.convergence_s <= out.poll_interval_s:
            raise ConfigError("policies.store.convergence_s must be longer than "
                              "policies.store.poll_interval_s")
        return out


@dataclass(frozen=True)
class PoliciesConfig:
    dir: Path
    reload_interval_s: float
    #: ``dir`` (this process's directory) or ``store`` (the fleet's published, signed revision).
    source: str = "dir"
    store: PolicyStoreConfig = field(
        default_factory=lambda: PolicyStoreConfig((), 1.0, 5.0))
    #: Shadow evaluation: a candidate revision decided alongside the live one, off the request
    #: path (sampled, bounded queue), never changing a decision; None turns it off.
    candidate_dir: Path | None = None
    #: Shadow evaluation of a published (inactive) revision of the store, by id, verified
    #: against ``store.trusted_keys`` like an active one; exclusive with ``candidate_dir``.
    candidate_revision: str | None = None
    shadow_sample_rate: float = 1.0
    shadow_queue_size: int = 1000

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "dir": "policies", "reload_interval_s": 2, "source": "dir",
        "store": PolicyStoreConfig.DEFAULTS, "candidate_dir": None,
        "candidate_revision": None, "shadow_sample_rate": 1.0, "shadow_queue_size": 1000,
    }

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], resolve: _Resolve,
                 store_backend: str = "sqlite") -> PoliciesConfig:
        store = PolicyStoreConfig.from_raw(raw["store"], resolve)
        if raw["source"] == "store" and store_backend == "none":
            raise ConfigError("policies.source is store but store.backend is none")
        if raw["source"] == "store" and not store.trusted_keys:
            raise ConfigError("policies.source is store but policies.store.trusted_keys is empty: "
                              "no revision could ever be accepted")
        if raw["source"] == "store" and not (store.trusted_activation_keys
                                             or store.activation_key):
            raise ConfigError("policies.source is store but neither policies.store."
                              "trusted_activation_keys nor policies.store.activation_key is set: "
                              "no activation could ever be accepted")
        candidate = raw.get("candidate_dir")
        candidate_revision = raw.get("candidate_revision") or None
        if candidate and candidate_revision:
            raise ConfigError("policies.candidate_dir and policies.candidate_revision are both "
                              "set: shadow evaluation takes one candidate")
        if candidate_revision and store_backend == "none":
            raise ConfigError("policies.candidate_revision is set but store.backend is none: "
                              "a published revision is read from the store")
        if candidate_revision and not store.trusted_keys:
            raise ConfigError("policies.candidate_revision is set but "
                              "policies.store.trusted_keys is empty: no revision could ever be "
                              "accepted")
        return cls(dir=resolve(raw["dir"]), reload_interval_s=float(raw["reload_interval_s"]),
                   source=raw["source"], store=store,
                   candidate_dir=resolve(candidate) if candidate else None,
                   candidate_revision=candidate_revision,
                   shadow_sample_rate=float(raw["shadow_sample_rate"]),
                   shadow_queue_size=int(raw["shadow_queue_size"]))


@dataclass(frozen=True)
class DecisionLogConfig:
    """The decision log with inputs (service/authz/decisionlog.py), the material for
    ``cpctl policy replay``. Off by default: it keeps every decision's input (subjects,
    resources, command hashes: personal and operational data that needs a retention decision),
    so an operator turns it on by choosing where it goes and how much of it is kept."""

    path: Path | None
    max_bytes: int
    backups: int
    queue_size: int

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "path": None, "max_bytes": 50_000_000, "backups": 5, "queue_size": 10_000,
    }

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], resolve: _Resolve) -> DecisionLogConfig:
        path = raw.get("path")
        return cls(path=resolve(path) if path else None, max_bytes=int(raw["max_bytes"]),
                   backups=int(raw["backups"]), queue_size=int(raw["queue_size"]))


@dataclass(frozen=True)
class AuthnConfig:
    """The ``authn`` section: what the authenticator, tokens and throttles use, as configured."""

    issuer: str
    audience: str
    identities: Path
    token_ttl_s: int = 900
    step_up_window_s: int = 300
    clock_skew_s: int = 30
    session_ttl_s: int = 28800
    #: Failed logins per (subject, client address), and failed OTP codes per subject, within a
    #: ``failure_window_s`` window (opened by the first failure) before 429 until it ends.
    max_failures: int = 5
    failure_window_s: int = 300
    #: Failed logins per client address within the window (many people may share one address).
    max_failures_per_addr: int = 50
    #: Per subject from every address there is no lockout, only a slowdown: from this many
    #: failures within the window on, each failure makes the subject's next attempt wait
    #: ``subject_delay_base_s``, doubling per failure up to ``subject_delay_max_s`` (429 with
    #: Retry-After meanwhile); a correct password resets it.
    subject_delay_after: int = 10
    subject_delay_base_s: int = 1
    subject_delay_max_s: int = 30
    #: Verified access tokens remembered per worker (their signature is not checked again).
    token_cache_size: int = 4096

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "issuer": "urn:controlplane:local",
        "audience": "urn:controlplane:api",
        "identities": "examples/identities.yaml",
        "token_ttl_s": 900,
        "step_up_window_s": 300,
        "clock_skew_s": 30,
        "session_ttl_s": 28800,
        "max_failures": 5,
        "failure_window_s": 300,
        "max_failures_per_addr": 50,
        "subject_delay_after": 10,
        "subject_delay_base_s": 1,
        "subject_delay_max_s": 30,
        "token_cache_size": 4096,
    }

    def __post_init__(self) -> None:
        if not 0 < self.token_ttl_s <= MAX_ACCESS_TTL_S:
            raise ConfigError(f"authn.token_ttl_s must be 1..{MAX_ACCESS_TTL_S}")
        if min(self.max_failures, self.max_failures_per_addr, self.failure_window_s,
               self.subject_delay_after, self.subject_delay_base_s) < 1:
            raise ConfigError("authn: throttle limits must be positive")
        if not self.subject_delay_base_s <= self.subject_delay_max_s <= self.failure_window_s:
            raise ConfigError("authn: subject_delay_base_s <= subject_delay_max_s <= "
                              "failure_window_s is required")

    @property
    def key_retain_s(self) -> int:
        """How long a retired signing key keeps verifying: the longest token life plus skew."""
        return MAX_ACCESS_TTL_S + self.clock_skew_s

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], resolve: _Resolve) -> AuthnConfig:
        ints = {f.name: int(raw[f.name]) for f in fields(cls) if f.type == "int"}
        return cls(issuer=raw["issuer"], audience=raw["audience"],
                   identities=resolve(raw["identities"]), **ints)


@dataclass(frozen=True)
class ApprovalsConfig:
    enabled: bool
    default_ttl_s: int
    pending_ttl_s: int

    DEFAULTS: ClassVar[dict[str, Any]] = {"store": "default", "default_ttl_s": 900,
                                          "pending_ttl_s": 86400}

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], store_backend: str) -> ApprovalsConfig:
        return cls(
            enabled=raw["store"] != "none" and store_backend != "none",
            default_ttl_s=int(raw["default_ttl_s"]),
            pending_ttl_s=int(raw["pending_ttl_s"]),
        )


@dataclass(frozen=True)
class AuditConfig:
    """The ``audit`` section: the JSON-lines mirror and the signed checkpoints' cadence and key."""

    jsonl_path: Path | None
    #: A checkpoint at least every this many records ...
    checkpoint_records: int
    #: ... or this many seconds after a record no checkpoint covers yet, whichever comes first.
    checkpoint_interval_s: float
    #: The audit signing keys (never in the database): ``<state_dir>/audit-keys`` by default.
    keys_dir: Path

    DEFAULTS: ClassVar[dict[str, Any]] = {"jsonl_path": None, "checkpoint_records": 100,
                                          "checkpoint_interval_s": 60, "keys_dir": None}

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], resolve: _Resolve, state_dir: Path) -> AuditConfig:
        jsonl, keys = raw.get("jsonl_path"), raw.get("keys_dir")
        return cls(
            jsonl_path=resolve(jsonl) if jsonl else None,
            checkpoint_records=int(raw["checkpoint_records"]),
            checkpoint_interval_s=float(raw["checkpoint_interval_s"]),
            keys_dir=resolve(keys) if keys else state_dir / "audit-keys",
        )


@dataclass(frozen=True)
class SinkConfig:
    """One notification sink (``notifications.sinks[]``): where events go and which ones."""

    name: str
    type: str  # webhook | slack
    #: A Secret: webhook and Slack URLs often carry their own credential in the path.
    url: Secret
    #: webhook: one or two ``whsec_`` signing secrets (two while rotating); slack: none.
    secrets: tuple[Secret, ...]
    #: The whole attempt (connect, send, read the answer) must end within this.
    timeout_s: float
    #: At most this much of the answer is read (the rest is dropped with the connection).
    max_response_bytes: int
    #: Only these event types / environments (empty: all).
    events: tuple[str, ...]
    envs: tuple[str, ...]

    DEFAULTS: ClassVar[dict[str, Any]] = {"secrets": [], "timeout_s": 10,
                                          "max_response_bytes": 65536, "events": [], "envs": []}

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], where: str) -> SinkConfig:
        item = {**cls.DEFAULTS, **raw}
        url = str(item["url"])
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{where}.url must be an http:// or https:// URL")
        secrets = tuple(str(v) for v in item["secrets"])
        if item["type"] == "webhook":
            if not 1 <= len(secrets) <= 2:
                raise ConfigError(f"{where}.secrets: a webhook sink needs one or two signing "
                                  "secrets (two while rotating)")
            for i, secret in enumerate(secrets):
                try:
                    parse_secret(secret)
                except SignatureError as exc:
                    raise ConfigError(f"{where}.secrets[{i}]: {exc}") from None
        elif secrets:
            raise ConfigError(f"{where}.secrets: only webhook sinks sign their messages")
        return cls(
            name=item["name"], type=item["type"], url=Secret(url),
            secrets=tuple(Secret(v) for v in secrets), timeout_s=float(item["timeout_s"]),
            max_response_bytes=int(item["max_response_bytes"]),
            events=tuple(item["events"]), envs=tuple(item["envs"]),
        )


@dataclass(frozen=True)
class NotificationsConfig:
    """The ``notifications`` section: the outbox dispatcher every server process runs, and the
    sinks it delivers approval events to (at least once; receivers de-duplicate on the id)."""

    #: The console's public base URL, for links in messages (``{public_url}/console/tickets/ID``).
    public_url: str | None
    #: The CloudEvents ``source`` of every event.
    source: str
    #: How often an idle dispatcher looks for due events.
    poll_interval_s: float
    #: Events claimed per round, and delivered at once.
    batch_size: int
    #: How long a claim holds an event: longer than any delivery round can take.
    lease_s: float
    #: Retries back off from ``backoff_base_s``, doubling, up to ``backoff_max_s`` (with jitter)
    #: until the event is ``max_age_s`` old; then it is dead (``cpctl notifications retry``).
    backoff_base_s: float
    backoff_max_s: float
    max_age_s: float
    #: Delivered events are deleted this long after delivery.
    retention_s: float
    sinks: tuple[SinkConfig, ...]

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "public_url": None,
        "source": "urn:controlplane",
        "poll_interval_s": 1,
        "batch_size": 50,
        "lease_s": 60,
        "backoff_base_s": 5,
        "backoff_max_s": 600,
        "max_age_s": 86400,
        "retention_s": 7 * 86400,
        "sinks": [],
    }

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> NotificationsConfig:
        sinks = tuple(SinkConfig.from_raw(item, f"notifications.sinks[{i}]")
                      for i, item in enumerate(raw["sinks"]))
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ConfigError("notifications.sinks: sink names must be unique")
        public_url = raw.get("public_url")
        if public_url is not None and urlsplit(public_url).scheme not in ("http", "https"):
            raise ConfigError("notifications.public_url must be an http:// or https:// URL")
        config = cls(
            public_url=public_url.rstrip("/") if public_url else None,
            source=str(raw["source"]),
            poll_interval_s=float(raw["poll_interval_s"]),
            batch_size=int(raw["batch_size"]),
            lease_s=float(raw["lease_s"]),
            backoff_base_s=float(raw["backoff_base_s"]),
            backoff_max_s=float(raw["backoff_max_s"]),
            max_age_s=float(raw["max_age_s"]),
            retention_s=float(raw["retention_s"]),
            sinks=sinks,
        )
        # A claim must outlast the round it is claimed for (every sink of an event is tried
        # at once, each within its timeout), or a second dispatcher could deliver the same
        # event while the first still is.
        slowest = max((s.timeout_s for s in sinks), default=0.0)
        if config.lease_s < 2 * slowest + 1:
            raise ConfigError("notifications.lease_s must be at least twice the longest sink "
                              "timeout_s plus one second")
        if config.backoff_base_s > config.backoff_max_s:
            raise ConfigError("notifications.backoff_base_s must not exceed backoff_max_s")
        return config


@dataclass(frozen=True)
class LoggingConfig:
    level: str
    access_log: bool
    mask_fields: tuple[str, ...]

    DEFAULTS: ClassVar[dict[str, Any]] = {"level": "INFO", "access_log": True, "mask_fields": []}

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> LoggingConfig:
        return cls(level=raw["level"], access_log=bool(raw["access_log"]),
                   mask_fields=tuple(raw["mask_fields"]))


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

_FEDERATION_ALGS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
                    "ES512", "EdDSA")


@dataclass(frozen=True)
class OidcStepUp:
    """Step-up through the IdP: a fresh login there (``prompt=login``, ``max_age=0``)."""

    acr_values: str | None = None
    #: The returned ``acr`` must be one of these (empty: any); ``amr`` must contain all of these.
    required_acr: tuple[str, ...] = ()
    required_amr: tuple[str, ...] = ()
    #: The IdP's ``auth_time`` may be at most this old when the callback arrives.
    max_auth_age_s: int = 120


@dataclass(frozen=True)
class OidcProvider:
    """One OpenID provider people sign in with (``authn.oidc.providers[]``)."""

    name: str
    issuer: str
    client_id: str
    #: ``client_secret_basic`` (with ``client_secret``) or ``private_key_jwt`` (RFC 7523: an
    #: assertion signed with the key in ``private_key_file``; no shared secret).
    client_auth: str
    client_secret: Secret | None
    private_key_file: Path | None
    display_name: str
    scopes: tuple[str, ...] = ("openid", "email", "profile")
    subject_claim: str = "email"
    #: The subject_id template, filled from ID-token claims; by default the provider's name,
    #: a colon and ``subject_claim`` (``corp:{email}``), so it never equals a local name. A
    #: template without that prefix may not map onto a local identity or a subject named in
    #: policy data (the sign-in is refused) unless ``links`` says so.
    subject: str = ""
    #: Explicit links to local subjects: the value of ``link_claim`` (``sub``, or a verified
    #: ``email``) -> the local subject_id that person signs in as.
    link_claim: str = "sub"
    links: tuple[tuple[str, str], ...] = ()
    groups_claim: str | None = "groups"
    #: Who may sign in at all: the subject's e-mail domain (when the subject is an address)
    #: and IdP groups; empty means no restriction on that axis.
    allowed_domains: tuple[str, ...] = ()
    allowed_groups: tuple[str, ...] = ()
    algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")
    step_up: OidcStepUp = field(default_factory=OidcStepUp)

    @property
    def namespaced(self) -> bool:
        """The subject template starts with ``<name>:``: every subject it makes is this
        provider's own (a local subject_id has no colon)."""
        return self.subject.startswith(self.name + ":")

    @property
    def uses_email(self) -> bool:
        """An e-mail address decides the subject, a link or the domain allow-list."""
        return (
            "email" in template_fields(self.subject)
            or (self.link_claim == "email" and bool(self.links))
            or bool(self.allowed_domains)
        )

    def linked(self, value: str) -> str | None:
        """The local subject ``links`` maps a ``link_claim`` value to, if any."""
        return next((local for claim, local in self.links if claim == value), None)


@dataclass(frozen=True)
class WorkloadIssuer:
    """One issuer of workload tokens accepted by the token exchange (``authn.workload.issuers[]``)."""

    name: str
    issuer: str
    audience: str
    subject: str  # template, e.g. "ci:github:{repository}"
    kind: str  # service | agent
    jwks_uri: str | None = None
    max_token_age_s: int = 600
    algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")
    #: claim -> accepted values (a token must match every condition; a list is any of).
    conditions: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class FederationConfig:
    """``authn.oidc`` and ``authn.workload``: identity federation (people and workloads)."""

    providers: tuple[OidcProvider, ...] = ()
    workload_issuers: tuple[WorkloadIssuer, ...] = ()
    #: Our public base URL; the IdP redirects to ``<base>/api/v1/authn/oidc/<name>/callback``.
    redirect_base_url: str = "http://127.0.0.1:8700"
    #: Plain HTTP to issuers on loopback (development and tests only); HTTPS otherwise.
    allow_http_loopback: bool = False
    login_ttl_s: int = 600

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "oidc": {"providers": [], "redirect_base_url": "http://127.0.0.1:8700",
                 "allow_http_loopback": False, "login_ttl_s": 600},
        "workload": {"issuers": []},
    }

    def provider(self, name: str) -> OidcProvider | None:
        return next((p for p in self.providers if p.name == name), None)

    @classmethod
    def from_raw(cls, authn: Mapping[str, Any], resolve: _Resolve) -> FederationConfig:
        oidc = authn.get("oidc") or {}
        workload = authn.get("workload") or {}
        providers = tuple(_oidc_provider(p, resolve) for p in oidc.get("providers") or [])
        issuers = tuple(_workload_issuer(i) for i in workload.get("issuers") or [])
        for kind, names in (("authn.oidc.providers", [p.name for p in providers]),
                            ("authn.workload.issuers", [i.name for i in issuers])):
            if len(set(names)) != len(names):
                raise ConfigError(f"{kind}: names must be unique")
        _check_namespaces(providers, issuers)
        base = str(oidc.get("redirect_base_url", "http://127.0.0.1:8700")).rstrip("/")
        if urlsplit(base).scheme not in ("http", "https") or not urlsplit(base).hostname:
            raise ConfigError("authn.oidc.redirect_base_url must be an http(s) URL")
        return cls(providers=providers, workload_issuers=issuers, redirect_base_url=base,
                   allow_http_loopback=bool(oidc.get("allow_http_loopback", False)),
                   login_ttl_s=int(oidc.get("login_ttl_s", 600)))


#: A local subject_id (schemas/identities.schema.json): never a colon, so never a federated one.
_LOCAL_SUBJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")


def template_fields(template: str) -> list[str]:
    """The claim names a subject template reads (``{claim}``); ``ValueError`` when it is not a
    plain template (a format spec, a conversion, an unbalanced brace, an empty name)."""
    names: list[str] = []
    for _, name, spec, conv in string.Formatter().parse(template):
        if name is None:
            continue
        if not name or spec or conv or not name.replace("_", "").replace(".", "").replace(
            "-", ""
        ).isalnum():
            raise ValueError(f"{{{name}}} is not a plain claim name")
        names.append(name)
    return names


def _literals(template: str) -> str:
    return "".join(literal for literal, *_ in string.Formatter().parse(template))


def _check_namespaces(
    providers: tuple[OidcProvider, ...], issuers: tuple[WorkloadIssuer, ...]
) -> None:
    """Each provider mints subjects in its own namespace only: a template either starts with
    ``<name>:`` or has no colon of its own (then it cannot write another provider's prefix);
    a workload issuer's template never starts with a sign-in provider's ``<name>:``."""
    bare = [p.name for p in providers if not p.namespaced]
    if len(bare) > 1:
        raise ConfigError(f"authn.oidc.providers: {bare} all have a subject template without "
                          "their '<name>:' prefix, so one could sign in as the other's person; "
                          "at most one provider may")
    for p in providers:
        where = f"authn.oidc.providers[{p.name}].subject"
        if not p.namespaced and ":" in _literals(p.subject):
            raise ConfigError(f"{where}: {p.subject!r} writes a colon outside this provider's "
                              f"namespace; start it with '{p.name}:' or use no colon")
    for i in issuers:
        for p in providers:
            if i.subject.startswith(p.name + ":"):
                raise ConfigError(f"authn.workload.issuers[{i.name}].subject: {i.subject!r} "
                                  f"is in the namespace of sign-in provider {p.name!r}")


def _algorithms(raw: Any, where: str) -> tuple[str, ...]:
    algs = tuple(raw or ("RS256", "ES256", "EdDSA"))
    bad = [a for a in algs if a not in _FEDERATION_ALGS]
    if bad or not algs:
        # Never "none", never HMAC: a public key must not double as a shared secret.
        raise ConfigError(f"{where}.algorithms: only public-key algorithms "
                          f"({', '.join(_FEDERATION_ALGS)}) are allowed, not {bad}")
    return algs


def _oidc_provider(raw: Mapping[str, Any], resolve: _Resolve) -> OidcProvider:
    where = f"authn.oidc.providers[{raw.get('name')}]"
    step = raw.get("step_up") or {}
    client_auth = raw.get("client_auth", "client_secret_basic")
    if client_auth == "client_secret_basic" and not raw.get("client_secret"):
        raise ConfigError(f"{where}: client_secret_basic needs client_secret")
    if client_auth == "private_key_jwt" and not raw.get("private_key_file"):
        raise ConfigError(f"{where}: private_key_jwt needs private_key_file")
    secret = raw.get("client_secret")
    key_file = raw.get("private_key_file")
    subject_claim = raw.get("subject_claim", "email")
    template = raw.get("subject") or f"{raw['name']}:{{{subject_claim}}}"
    try:
        template_fields(template)
    except ValueError as exc:
        raise ConfigError(f"{where}.subject: {exc}") from None
    link_claim = raw.get("link_claim", "sub")
    if link_claim not in ("sub", "email"):
        raise ConfigError(f"{where}.link_claim: must be 'sub' or 'email' (a verified claim)")
    links = tuple((str(k), str(v)) for k, v in sorted((raw.get("links") or {}).items()))
    for claim, local in links:
        if not _LOCAL_SUBJECT.fullmatch(local):
            raise ConfigError(f"{where}.links[{claim!r}]: {local!r} is not a local subject_id")
    return OidcProvider(
        name=raw["name"], issuer=raw["issuer"], client_id=raw["client_id"],
        client_auth=client_auth, client_secret=Secret(secret) if secret else None,
        private_key_file=resolve(key_file) if key_file else None,
        display_name=raw.get("display_name") or raw["name"],
        scopes=tuple(raw.get("scopes") or ("openid", "email", "profile")),
        subject_claim=subject_claim, subject=template, link_claim=link_claim, links=links,
        groups_claim=raw.get("groups_claim", "groups"),
        allowed_domains=tuple(d.lower() for d in raw.get("allowed_domains") or ()),
        allowed_groups=tuple(raw.get("allowed_groups") or ()),
        algorithms=_algorithms(raw.get("algorithms"), where),
        step_up=OidcStepUp(
            acr_values=step.get("acr_values"),
            required_acr=tuple(step.get("required_acr") or ()),
            required_amr=tuple(step.get("required_amr") or ()),
            max_auth_age_s=int(step.get("max_auth_age_s", 120)),
        ),
    )


def _workload_issuer(raw: Mapping[str, Any]) -> WorkloadIssuer:
    where = f"authn.workload.issuers[{raw.get('name')}]"
    conditions = tuple(
        (str(claim), tuple(str(v) for v in (value if isinstance(value, list) else [value])))
        for claim, value in sorted((raw.get("conditions") or {}).items())
    )
    if not conditions:
        # Without a condition any workload of the issuer (any repository, any cluster) would do.
        raise ConfigError(f"{where}.conditions: at least one claim condition is required")
    return WorkloadIssuer(
        name=raw["name"], issuer=raw["issuer"], audience=raw["audience"],
        subject=raw["subject"], kind=raw.get("kind", "service"),
        jwks_uri=raw.get("jwks_uri"), max_token_age_s=int(raw.get("max_token_age_s", 600)),
        algorithms=_algorithms(raw.get("algorithms"), where), conditions=conditions,
    )


@dataclass(frozen=True)
class InventoryConfig:
    databases: tuple[DatabaseItem, ...] | None  # None: no inventory configured
    storage: tuple[StorageItem, ...] | None

    DEFAULTS: ClassVar[dict[str, Any]] = {"databases": [], "storage": []}

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> InventoryConfig:
        return cls(databases=_inventory(raw.get("databases"), DatabaseItem, "engine"),
                   storage=_inventory(raw.get("storage"), StorageItem, "provider"))


@dataclass(frozen=True)
class Config:
    """The whole, validated configuration. Build it with ``load``."""

    mode: str
    state_dir: Path
    server: ServerConfig
    store: StoreConfig
    policies: PoliciesConfig
    environments: Environments
    authn: AuthnConfig
    approvals: ApprovalsConfig
    audit: AuditConfig
    logging: LoggingConfig
    inventory: InventoryConfig
    decision_log: DecisionLogConfig = field(
        default_factory=lambda: DecisionLogConfig(None, 50_000_000, 5, 10_000)
    )
    notifications: NotificationsConfig = field(
        default_factory=lambda: NotificationsConfig.from_raw(NotificationsConfig.DEFAULTS))
    federation: FederationConfig = field(default_factory=FederationConfig)
    source: str | None = None  # the file it came from, for messages

    def is_production(self, env: str) -> bool:
        """Unknown environments count as production: fail closed."""
        return self.environments.is_production(env)

    @property
    def runtime_mode(self) -> str:
        """``embedded-sqlite``, ``postgresql`` or ``stateless`` (no store)."""
        return {"sqlite": "embedded-sqlite", "postgres": "postgresql"}.get(
            self.store.backend, "stateless"
        )


CONFIG = web.AppKey("config", Config)


#: The whole default document: each section's defaults, owned by its dataclass.
DEFAULTS: dict[str, Any] = {
    "mode": "embedded",
    "state_dir": ".state",
    "server": ServerConfig.DEFAULTS,
    "store": StoreConfig.DEFAULTS,
    "policies": PoliciesConfig.DEFAULTS,
    "environments": Environments.DEFAULTS,
    "authn": {**AuthnConfig.DEFAULTS, **FederationConfig.DEFAULTS},
    "approvals": ApprovalsConfig.DEFAULTS,
    "audit": AuditConfig.DEFAULTS,
    "logging": LoggingConfig.DEFAULTS,
    "inventory": InventoryConfig.DEFAULTS,
    "decision_log": DecisionLogConfig.DEFAULTS,
    "notifications": NotificationsConfig.DEFAULTS,
}


def load_from_process(
    path: str | Path | None = None, *, overrides: Mapping[str, Any] | None = None
) -> Config:
    """``load`` for a command started from a shell: the file is ``path`` or
    ``$CONTROLPLANE_CONFIG``, and this process's ``CONTROLPLANE_*`` variables apply. With
    ``load`` itself, the one place the service's configuration meets the environment."""
    environ = os.environ
    return load(path or environ.get("CONTROLPLANE_CONFIG"), environ, overrides=overrides)


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
    env_names: dict[str, str] = {}
    env_doc = _from_environ(environ or {}, env_names)
    _merge(raw, env_doc)
    if overrides:
        _merge(raw, copy.deepcopy(dict(overrides)))
    _check(raw, source or "configuration", env_names)
    try:
        return _build(raw, base_dir or Path.cwd(), source)
    except ConfigError as exc:
        raise _named(exc, env_names) from None


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "boolean": "true or false",
               "string": "a string", "object": "a mapping (set it in the file)",
               "array": "a list (set it in the file)"}


def _check(
    document: dict[str, Any], source: str | None, env_names: Mapping[str, str] | None = None
) -> None:
    """Validate against the schema. A violation at (or under) a key a ``CONTROLPLANE_*``
    variable set names that variable: ``CONTROLPLANE_PORT: must be an integer``."""
    try:
        validate("config.schema.json", document)
    except ValidationFailed as exc:
        details = []
        for v in exc.violations:
            variable = _variable_at(v.pointer, v.message, env_names or {})
            if variable is None:
                details.append(f"{source or 'configuration'}: {v.pointer or '/'}: {v.message}")
                continue
            kind = v.message.removeprefix("must be of type ")
            message = f"must be {_TYPE_WORDS[kind]}" if kind in _TYPE_WORDS else v.message
            details.append(f"{variable}: {message}")
        raise ConfigError("; ".join(details)) from None


def _variable_at(pointer: str, message: str, env_names: Mapping[str, str]) -> str | None:
    """The variable that set the value at ``pointer`` (or a key under it), if one did."""
    if message.startswith("unknown property: "):
        for key in message.removeprefix("unknown property: ").split(", "):
            if f"{pointer}/{key}" in env_names:
                return env_names[f"{pointer}/{key}"]
    for at, name in env_names.items():
        if pointer == at or pointer.startswith(at + "/"):
            return name
    return None


def _named(error: ConfigError, env_names: Mapping[str, str]) -> ConfigError:
    """A section's own check (``authn.token_ttl_s must be ...``) names the variable that set
    the key, when one did."""
    key = str(error).split(" ", 1)[0].rstrip(":")
    name = env_names.get("/" + key.replace(".", "/"))
    return ConfigError(f"{name}: {error}") if name else error


def _merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict) and key != "environments":
            _merge(into[key], value)
        else:
            into[key] = value


def _from_environ(
    environ: Mapping[str, str], names: dict[str, str] | None = None
) -> dict[str, Any]:
    """The ``CONTROLPLANE_*`` variables as a document; ``names`` gets pointer -> variable."""
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
        if names is not None:
            names["/" + "/".join(path)] = name
    return document


def _build(raw: dict[str, Any], base: Path, source: str | None) -> Config:
    def resolve(value: str) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else (base / p)

    state_dir = resolve(raw["state_dir"])
    store = StoreConfig.from_raw(raw["store"], resolve, state_dir)
    return Config(
        mode=raw["mode"],
        state_dir=state_dir,
        server=ServerConfig.from_raw(raw["server"]),
        store=store,
        policies=PoliciesConfig.from_raw(raw["policies"], resolve, store.backend),
        environments=Environments.from_raw(raw["environments"]),
        authn=AuthnConfig.from_raw(raw["authn"], resolve),
        approvals=ApprovalsConfig.from_raw(raw["approvals"], store.backend),
        audit=AuditConfig.from_raw(raw["audit"], resolve, state_dir),
        logging=LoggingConfig.from_raw(raw["logging"]),
        inventory=InventoryConfig.from_raw(raw["inventory"]),
        decision_log=DecisionLogConfig.from_raw(raw["decision_log"], resolve),
        notifications=NotificationsConfig.from_raw(raw["notifications"]),
        federation=FederationConfig.from_raw(raw["authn"], resolve),
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
