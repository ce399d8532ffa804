"""The normalizer on every syntax variant: YAML 1.2 scalars, anchors, x-, interpolation, merge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.compose.normalize import NormalizeError, normalize_files, normalize_text
from service.compose.source import Interpolator, load_yaml, parse_dotenv


def one(text: str, variables: dict[str, str] | None = None, name: str = "s") -> dict[str, Any]:
    return normalize_text(text, variables=variables)["services"][name]


# --- YAML -------------------------------------------------------------------------------------

def test_yaml_11_traps_stay_strings() -> None:
    svc = one("services:\n s:\n  user: 0:0\n  ports: [2222:22]\n  restart: no\n"
              "  labels: {on: yes, date: 2024-01-01}\n")
    assert svc["user"] == "0:0"
    assert svc["ports"][0]["published"] == "2222" and svc["ports"][0]["target"] == 22
    assert svc["restart"] == "no"
    assert svc["labels"] == {"on": "yes", "date": "2024-01-01"}


def test_anchors_merge_keys_and_extensions_dropped() -> None:
    text = """
x-base: &base
  image: a:1
  environment: {A: "1"}
x-top: ignored
services:
  s:
    <<: *base
    x-note: dropped
    environment: {B: "2"}
    labels: {x-keep: "labels are user data"}
  x-ray:
    image: b:1
"""
    fields = normalize_text(text)
    assert "x-base" not in fields and "x-top" not in fields
    assert fields["services"]["s"] == {"image": "a:1", "environment": {"B": "2"},
                                       "labels": {"x-keep": "labels are user data"}}
    assert fields["services"]["x-ray"] == {"image": "b:1"}  # a service name, not an extension


# --- interpolation ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "variables", "want"), [
    pytest.param("${A}", {"A": "x"}, "x", id="braced"),
    pytest.param("$A-$B", {"A": "x", "B": "y"}, "x-y", id="unbraced"),
    pytest.param("${A:-d}", {"A": ""}, "d", id="colon-default-empty"),
    pytest.param("${A-d}", {"A": ""}, "", id="dash-default-set-empty"),
    pytest.param("${A-d}", {}, "d", id="dash-default-unset"),
    pytest.param("${A:-${B:-nested}}", {}, "nested", id="nested-default"),
    pytest.param("${A:+alt}", {"A": "x"}, "alt", id="alternative"),
    pytest.param("${A:+alt}", {}, "", id="alternative-unset"),
    pytest.param("$${A} $$A", {"A": "x"}, "${A} $A", id="dollar-escape"),
    pytest.param("${A:?must}", {"A": "v"}, "v", id="required-present"),
    pytest.param("${MISSING}", {}, "", id="missing-is-empty"),
    pytest.param("cost: 5$", {}, "cost: 5$", id="lone-dollar"),
])
def test_interpolation(text: str, variables: dict[str, str], want: str) -> None:
    assert Interpolator(variables).substitute(text) == want


@pytest.mark.parametrize("text", ["${A:?A must be set}", "${A?err}"])
def test_required_variable_missing_is_an_error(text: str) -> None:
    with pytest.raises(NormalizeError, match="A"):
        Interpolator({}).substitute(text)
    assert Interpolator({"A": ""}).substitute("${A?x}") == ""


def test_interpolation_types_scalars_afterwards() -> None:
    svc = one("services:\n s:\n  read_only: ${RO}\n  privileged: '${P:-false}'\n"
              "  healthcheck: {test: true, retries: $R}\n  deploy: {resources: {limits: "
              "{memory: '${M}', cpus: '${C}'}}}\n", {"RO": "true", "R": "3", "M": "1g", "C": "0.5"})
    assert svc["read_only"] is True and svc["privileged"] is False
    assert svc["healthcheck"]["retries"] == 3
    assert svc["deploy"]["resources"]["limits"] == {"memory": 1024**3, "cpus": 0.5}


def test_dotenv_parsing() -> None:
    env = parse_dotenv('# c\nA=1\nexport B="two words" \nC=\'$A lit\'\nD=x # comment\n'
                       'E="${A}-${Z:-z}"\nF\n', {"Z": "shell"})
    assert env == {"A": "1", "B": "two words", "C": "$A lit", "D": "x", "E": "1-shell", "F": ""}


def test_env_file_beside_first_file_and_shell_wins(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text("services:\n s:\n  image: 'a:${TAG}'\n"
                                           "  environment: [FROM_SHELL, 'X=${X}']\n")
    (tmp_path / ".env").write_text("TAG=1.0\nX=dotenv\n")
    fields = normalize_files([tmp_path / "compose.yaml"],
                             environ={"X": "shell", "FROM_SHELL": "v"})
    assert fields["services"]["s"]["image"] == "a:1.0"
    # the environment says what the file says: the reference, the bare name (the shell and
    # the .env are interpolated elsewhere, and secret-env judges the file's own text)
    assert fields["services"]["s"]["environment"] == {"FROM_SHELL": None, "X": "${X}"}
    other = tmp_path / "other.env"
    other.write_text("TAG=2.0\n")
    fields = normalize_files([tmp_path / "compose.yaml"], environ={}, env_file=other)
    assert fields["services"]["s"]["image"] == "a:2.0"


# --- ports ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "want"), [
    pytest.param(80, [{"target": 80, "protocol": "tcp", "mode": "ingress"}], id="int"),
    pytest.param("8080:80", [{"target": 80, "published": "8080", "protocol": "tcp",
                              "mode": "ingress"}], id="published"),
    pytest.param("127.0.0.1:8080:80/udp", [{"target": 80, "published": "8080",
                                            "host_ip": "127.0.0.1", "protocol": "udp",
                                            "mode": "ingress"}], id="ip-udp"),
    pytest.param("[::1]:8080:80", [{"target": 80, "published": "8080", "host_ip": "::1",
                                    "protocol": "tcp", "mode": "ingress"}], id="ipv6"),
    pytest.param("127.0.0.1::80", [{"target": 80, "host_ip": "127.0.0.1", "protocol": "tcp",
                                    "mode": "ingress"}], id="ip-ephemeral"),
    pytest.param("9000-9001:8000-8001", [
        {"target": 8000, "target_end": 8001, "published": "9000-9001", "protocol": "tcp",
         "mode": "ingress"}], id="range"),
    pytest.param("1-65535:1-65535", [
        {"target": 1, "target_end": 65535, "published": "1-65535", "protocol": "tcp",
         "mode": "ingress"}], id="full-range-is-one-entry"),
    pytest.param("7000-7002", [{"target": 7000, "target_end": 7002, "protocol": "tcp",
                                "mode": "ingress"}], id="target-range"),
    pytest.param("9000-9010:80", [{"target": 80, "published": "9000-9010", "protocol": "tcp",
                                   "mode": "ingress"}], id="published-range"),
    pytest.param({"target": "80", "published": 8080, "host_ip": "10.0.0.1", "mode": "host"},
                 [{"target": 80, "published": "8080", "host_ip": "10.0.0.1", "protocol": "tcp",
                   "mode": "host"}], id="long"),
])
def test_ports(spec: Any, want: list[dict[str, Any]]) -> None:
    import json

    svc = one(f"services:\n s:\n  ports: [{json.dumps(spec)}]\n")
    assert svc["ports"] == want


def test_bad_port_is_an_error() -> None:
    with pytest.raises(NormalizeError):
        one("services:\n s:\n  ports: ['http:80']\n")


# --- volumes ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "want"), [
    pytest.param("/data", {"type": "volume", "target": "/data"}, id="anonymous"),
    pytest.param("db:/var/lib/db", {"type": "volume", "source": "db", "target": "/var/lib/db"},
                 id="named"),
    pytest.param("db:/d:ro,nocopy", {"type": "volume", "source": "db", "target": "/d",
                                     "volume": {"nocopy": True}, "read_only": True},
                 id="named-options"),
    pytest.param("./src:/app:ro", {"type": "bind", "source": "./src", "target": "/app",
                                   "bind": {"create_host_path": True}, "read_only": True},
                 id="relative-bind"),
    pytest.param("/etc/:/host/etc:z", {"type": "bind", "source": "/etc", "target": "/host/etc",
                                       "bind": {"create_host_path": True, "selinux": "z"}},
                 id="absolute-bind-cleaned"),
    pytest.param("/var/run/../run/docker.sock:/s", {"type": "bind",
                                                    "source": "/var/run/docker.sock",
                                                    "target": "/s",
                                                    "bind": {"create_host_path": True}},
                 id="dotdot-cleaned"),
    pytest.param("~/x:/x:rshared", {"type": "bind", "source": "~/x", "target": "/x",
                                    "bind": {"create_host_path": True, "propagation": "rshared"}},
                 id="home-propagation"),
    pytest.param({"type": "bind", "source": "//var/run/docker.sock", "target": "/s",
                  "read_only": "true"},
                 {"type": "bind", "source": "/var/run/docker.sock", "target": "/s",
                  "read_only": True}, id="long"),
    pytest.param({"type": "tmpfs", "target": "/t", "tmpfs": {"size": "64m"}},
                 {"type": "tmpfs", "target": "/t", "tmpfs": {"size": 64 * 1024**2}},
                 id="long-tmpfs"),
])
def test_volumes(spec: Any, want: dict[str, Any]) -> None:
    import json

    assert one(f"services:\n s:\n  volumes: [{json.dumps(spec)}]\n")["volumes"] == [want]


# --- environment and other lists -------------------------------------------------------------

def test_environment_list_and_map_are_the_same() -> None:
    as_list = one("services:\n s:\n  environment: [A=1, 'B=x=y', C, 'D=', E]\n", {"C": "env"})
    as_map = one("services:\n s:\n  environment: {A: 1, B: x=y, C: null, D: '', E: null}\n",
                 {"C": "env"})
    want = {"A": "1", "B": "x=y", "C": None, "D": "", "E": None}  # C: as written
    assert as_list["environment"] == want
    assert as_map["environment"] == want


def test_short_forms_of_other_fields() -> None:
    svc = one("""services:
 s:
  command: echo "hello world"
  entrypoint: [/bin/sh, -c]
  user: 1000
  env_file: [.env, {path: opt.env, required: false}]
  secrets: [db, {source: api, target: api_key, mode: 0440}]
  devices: ["/dev/fuse", "/dev/sda:/dev/xvda:r"]
  cap_add: SYS_TIME
  tmpfs: /tmp
  healthcheck: {test: curl -f localhost}
  mem_limit: 512m
  cpus: 1.5
  depends_on: [db]
  networks: [front]
  labels: [a=b]
""")
    assert svc["command"] == ["echo", "hello world"]
    assert svc["user"] == "1000"
    assert svc["env_file"] == [{"path": ".env", "required": True},
                               {"path": "opt.env", "required": False}]
    assert svc["secrets"] == [{"source": "db"},
                              {"source": "api", "target": "api_key", "mode": 0o440}]
    assert svc["devices"] == [{"source": "/dev/fuse", "target": "/dev/fuse", "permissions": "rwm"},
                              {"source": "/dev/sda", "target": "/dev/xvda", "permissions": "r"}]
    assert svc["cap_add"] == ["SYS_TIME"] and svc["tmpfs"] == ["/tmp"]
    assert svc["healthcheck"] == {"test": ["CMD-SHELL", "curl -f localhost"]}
    assert svc["deploy"] == {"resources": {"limits": {"memory": 512 * 1024**2, "cpus": 1.5}}}
    assert "mem_limit" not in svc and "cpus" not in svc
    assert svc["depends_on"] == {"db": {"condition": "service_started", "required": True}}
    assert svc["networks"] == {"front": None} and svc["labels"] == {"a": "b"}


# --- merging ----------------------------------------------------------------------------------

def test_multi_file_merge_rules(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("""services:
 s:
  image: a:1
  command: [run, a]
  ports: ["80:80", "127.0.0.1:443:443"]
  volumes: ["data:/data", "./x:/x"]
  environment: {A: "1", B: "1"}
  cap_add: [CHOWN]
  deploy: {resources: {limits: {memory: 1g, cpus: 1}}}
""")
    (tmp_path / "b.yaml").write_text("""services:
 s:
  command: [run, b]
  ports: ["8080:80"]
  volumes: ["./y:/data"]
  environment: [B=2, C=3]
  cap_add: [CHOWN, FOWNER]
  deploy: {resources: {limits: {memory: 2g}}}
  labels: !reset {}
 t:
  image: t:1
""")
    fields = normalize_files([tmp_path / "a.yaml", tmp_path / "b.yaml"], environ={})
    s = fields["services"]["s"]
    assert s["command"] == ["run", "b"]  # replaced
    assert [p["published"] for p in s["ports"]] == ["80", "443", "8080"]  # union
    assert [(v["target"], v.get("source")) for v in s["volumes"]] == [("/x", "./x"),
                                                                      ("/data", "./y")]
    assert s["environment"] == {"A": "1", "B": "2", "C": "3"}
    assert s["cap_add"] == ["CHOWN", "FOWNER"]
    assert s["deploy"]["resources"]["limits"] == {"memory": 2 * 1024**3, "cpus": 1}
    assert "labels" not in s
    assert set(fields["services"]) == {"s", "t"}


def test_reset_and_override_tags(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("services:\n s:\n  image: a\n  ports: ['80:80']\n"
                                     "  environment: {A: '1'}\n")
    (tmp_path / "b.yaml").write_text("services:\n s:\n  ports: !reset []\n"
                                     "  environment: !override {B: '2'}\n")
    s = normalize_files([tmp_path / "a.yaml", tmp_path / "b.yaml"], environ={})["services"]["s"]
    assert "ports" not in s and s["environment"] == {"B": "2"}


def test_extends_same_file_and_other_file(tmp_path: Path) -> None:
    (tmp_path / "common.yaml").write_text("services:\n base:\n  image: c:1\n  user: '1'\n")
    (tmp_path / "compose.yaml").write_text("""services:
 a:
  extends: {file: common.yaml, service: base}
  environment: {X: "1"}
 b:
  extends: a
  user: "2"
""")
    services = normalize_files([tmp_path / "compose.yaml"], environ={})["services"]
    assert services["a"] == {"image": "c:1", "user": "1", "environment": {"X": "1"}}
    assert services["b"] == {"image": "c:1", "user": "2", "environment": {"X": "1"}}


def test_extends_cycle_is_an_error() -> None:
    with pytest.raises(NormalizeError, match="cycle"):
        normalize_text("services:\n a: {extends: b}\n b: {extends: a}\n")


def test_include(tmp_path: Path) -> None:
    (tmp_path / "db.yaml").write_text("services:\n db:\n  image: pg:16\n")
    (tmp_path / "compose.yaml").write_text("include: [db.yaml]\nservices:\n app:\n  image: a:1\n")
    fields = normalize_files([tmp_path / "compose.yaml"], environ={})
    assert set(fields["services"]) == {"db", "app"} and "include" not in fields


@pytest.mark.parametrize("text", ["[1, 2]", "services: [a]", "services:\n s: [1]",
                                  "services: {s: {image: a}\n"])
def test_unusable_documents_are_clear_errors(text: str) -> None:
    with pytest.raises(NormalizeError):
        normalize_text(text)


def test_version_dropped_and_empty_file() -> None:
    assert normalize_text("version: '3.8'\nservices: {}\n") == {"services": {}}
    assert normalize_text("") == {"services": {}}


def test_deploy_null_is_accepted_as_no_deploy_settings() -> None:
    from service.compose.normalize import normalize_text

    fields = normalize_text("services:\n  web:\n    image: a:1\n    deploy: null\n")
    assert fields["services"]["web"] == {"image": "a:1"}
    fields = normalize_text("services:\n  web:\n    image: a:1\n    deploy:\n    pids_limit: 50\n")
    assert fields["services"]["web"]["deploy"] == {"resources": {"limits": {"pids": 50}}}



def test_deep_nesting_is_an_error_never_a_crash_of_the_process() -> None:
    # libyaml scans and parses (when PyYAML has it), PyYAML's Python composer builds the nodes:
    # libyaml's own composer recurses in C and kills the process on such a document.
    depth = 200_000
    with pytest.raises((RecursionError, NormalizeError)):
        load_yaml("[" * depth + "]" * depth)
