"""Configuration: defaults < YAML < environment; validation; secrets never printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.config import ConfigError, Secret, load

REPO = Path(__file__).resolve().parent.parent


def test_defaults_need_nothing(tmp_path):
    config = load(None, {}, base_dir=tmp_path)
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8700)
    assert config.runtime_mode == "embedded-sqlite"
    assert config.store.sqlite_path == tmp_path / ".state" / "controlplane.db"
    assert config.policies.dir == tmp_path / "policies"
    assert config.is_production("prod") and not config.is_production("dev")
    assert config.server.max_body_bytes == 1024 * 1024
    assert (config.store.timeout_s, config.store.probe_timeout_s) == (5.0, 1.0)
    assert config.store.failure_window_s == 10.0


def test_unknown_environment_counts_as_production(tmp_path):
    assert load(None, {}, base_dir=tmp_path).is_production("qa-7")


def test_a_request_spanning_every_environment_is_judged_as_the_strictest():
    """The first production environment in the configured order, else the first one."""
    from service.config import Environments

    assert Environments({"dev": False, "prod": True, "prod-eu": True}).strictest() == "prod"
    assert Environments({"prod-eu": True, "dev": False, "prod": True}).strictest() == "prod-eu"
    assert Environments({"dev": False, "staging": False}).strictest() == "dev"
    with pytest.raises(ConfigError):
        Environments({})


def test_yaml_then_environment_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  port: 9000\n  host: 0.0.0.0\nlogging:\n  level: DEBUG\n")
    config = load(
        path,
        {"CONTROLPLANE_PORT": "9100", "CONTROLPLANE_LOGGING__LEVEL": "WARNING", "HOME": "/x"},
        base_dir=tmp_path,
    )
    assert config.server.port == 9100
    assert config.server.host == "0.0.0.0"
    assert config.logging.level == "WARNING"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("server:\n  prot: 1\n", "/server: unknown property: prot", id="typo"),
        pytest.param("server:\n  port: high\n", "/server/port", id="wrong-type"),
        pytest.param("server: [\n", "not valid YAML at line", id="bad-yaml"),
        pytest.param("- a\n", "top level must be a mapping", id="not-mapping"),
        pytest.param("store:\n  backend: postgres\n", "dsn is not set", id="postgres-no-dsn"),
        pytest.param("store:\n  probe_timeout_s: 0\n", "/store/probe_timeout_s", id="no-probe-time"),
    ],
)
def test_bad_files_are_rejected_with_a_location(tmp_path, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path, {}, base_dir=tmp_path)
    assert fragment in str(err.value)


def test_bad_environment_value_is_rejected(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(None, {"CONTROLPLANE_PORT": "not-a-port"}, base_dir=tmp_path)
    assert str(err.value) == "CONTROLPLANE_PORT: must be an integer"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"CONTROLPLANE_STORE__TIMEOUT_S": "soon"}, "CONTROLPLANE_STORE__TIMEOUT_S: must be a number"),
        ({"CONTROLPLANE_STORE__BOGUS": "1"}, "CONTROLPLANE_STORE__BOGUS: unknown property: bogus"),
        ({"CONTROLPLANE_AUTHN__MAX_FAILURES": "0"}, "CONTROLPLANE_AUTHN__MAX_FAILURES: "),
        (
            {"CONTROLPLANE_STORE__BACKEND": "postgres",
             "CONTROLPLANE_STORE__POSTGRES__DSN": "mysql://u:topsecret@h/db"},
            "CONTROLPLANE_STORE__POSTGRES__DSN: store.postgres.dsn must be a postgresql:// URL",
        ),
    ],
)
def test_environment_errors_name_the_variable(tmp_path, environ, message):
    with pytest.raises(ConfigError) as err:
        load(None, environ, base_dir=tmp_path)
    assert str(err.value).startswith(message)
    assert "topsecret" not in str(err.value)


def test_file_errors_still_name_the_file_and_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  port: nope\n")
    with pytest.raises(ConfigError) as err:
        load(path, {"CONTROLPLANE_HOST": "127.0.0.1"}, base_dir=tmp_path)
    assert str(err.value).startswith(f"{path}: /server/port: ")


def test_dsn_is_a_secret(tmp_path):
    config = load(
        None,
        {
            "CONTROLPLANE_STORE__BACKEND": "postgres",
            "CONTROLPLANE_STORE__POSTGRES__DSN": "postgresql://u:topsecret@h/db",
        },
        base_dir=tmp_path,
    )
    assert isinstance(config.store.postgres_dsn, Secret)
    assert "topsecret" not in repr(config)
    assert config.store.url is not None
    assert config.store.url.reveal() == "postgresql://u:topsecret@h/db"


def test_example_config_is_valid_and_complete():
    config = load(REPO / "examples" / "config.yaml", {}, base_dir=REPO)
    assert config.server.port == 8700
    # The example documents every top-level section.
    text = (REPO / "examples" / "config.yaml").read_text()
    for section in ("server:", "store:", "policies:", "environments:", "authn:", "approvals:",
                    "audit:", "logging:", "inventory:", "state_dir:", "mode:"):
        assert section in text, section


def _providers(tmp_path: Path, *providers: str, issuers: str = "") -> Path:
    path = tmp_path / "c.yaml"
    common = "issuer: https://idp.test, client_id: cp, client_secret: s"
    text = "authn:\n  oidc:\n    providers:\n" + "".join(
        f"      - {{name: {name}, {common}{extra}}}\n" for name, extra in
        (p.split("|", 1) for p in providers))
    if issuers:
        text += "  workload:\n    issuers:\n" + issuers
    path.write_text(text)
    return path


def test_federated_subjects_are_namespaced_by_default(tmp_path):
    config = load(_providers(tmp_path, "corp|", "partner|, subject_claim: sub"), {},
                  base_dir=tmp_path)
    corp, partner = config.federation.providers
    assert (corp.subject, corp.namespaced) == ("corp:{email}", True)
    assert (partner.subject, partner.namespaced) == ("partner:{sub}", True)


@pytest.mark.parametrize(("providers", "issuers", "fragment"), [
    pytest.param(("corp|, subject: '{email}'", "partner|, subject: '{sub}'"), "",
                 "at most one provider may", id="two-bare-templates"),
    pytest.param(("partner|, subject: 'corp:{email}'",), "",
                 "writes a colon outside this provider's namespace", id="another-namespace"),
    pytest.param(("corp|, subject: '{email!r}'",), "", "not a plain claim name", id="conversion"),
    pytest.param(("corp|, link_claim: name",), "", "/link_claim: must be one of", id="link-claim"),
    pytest.param(("corp|, links: {abc: 'x:y'}",), "", "/links/abc", id="link-target"),
    pytest.param(("corp|",), "      - {name: gh, issuer: https://gh.test, audience: a, "
                 "subject: 'corp:{sub}', conditions: {sub: x}}\n",
                 "in the namespace of sign-in provider 'corp'", id="workload-in-namespace"),
])
def test_federated_namespaces_cannot_overlap(tmp_path, providers, issuers, fragment):
    with pytest.raises(ConfigError) as err:
        load(_providers(tmp_path, *providers, issuers=issuers), {}, base_dir=tmp_path)
    assert fragment in str(err.value)
