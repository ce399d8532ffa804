"""Every compose rule, positive and negative, evaluated through the one-query matrix."""

from __future__ import annotations

from typing import Any

import pytest

from tests.compose.support import Check, cell

HARDENED: dict[str, Any] = {
    "image": "registry.example/app:1.2.3@sha256:" + "a" * 64,
    "user": "10001:10001",
    "read_only": True,
    "cap_drop": ["ALL"],
    "healthcheck": {"test": ["CMD", "/healthz"]},
    "security_opt": ["no-new-privileges:true"],
    "networks": {"backend": None},
    "deploy": {"resources": {"limits": {"cpus": 0.5, "memory": 268435456, "pids": 200}}},
}


def svc(**changes: Any) -> dict[str, Any]:
    """A hardened service (passes every rule in prod) with ``changes``; None removes a key."""
    out = {**HARDENED, **changes}
    return {k: v for k, v in out.items() if v is not None}


CASES = [
    # privileged
    pytest.param("privileged", svc(privileged=True), None, "fail", id="privileged-true"),
    pytest.param("privileged", svc(privileged=False), None, "pass", id="privileged-false"),
    # host namespaces
    pytest.param("host-network", svc(network_mode="host"), None, "fail", id="network-host"),
    pytest.param("host-network", svc(network_mode="bridge"), None, "pass", id="network-bridge"),
    pytest.param("host-network", svc(network_mode="service:vpn"), None, "pass", id="network-svc"),
    pytest.param("host-pid", svc(pid="host"), None, "fail", id="pid-host"),
    pytest.param("host-pid", svc(pid="service:app"), None, "pass", id="pid-service"),
    pytest.param("host-ipc", svc(ipc="host"), None, "fail", id="ipc-host"),
    pytest.param("host-ipc", svc(ipc="shareable"), None, "pass", id="ipc-shareable"),
    # sensitive mounts
    *[pytest.param("sensitive-mounts",
                   svc(volumes=[{"type": "bind", "source": src, "target": "/mnt"}]), None, want,
                   id=f"mount-{src}")
      for src, want in [("/var/run/docker.sock", "fail"),
                        ("/run/containerd/containerd.sock", "fail"),
                        ("/", "fail"), ("/etc", "fail"), ("/proc", "fail"), ("/sys", "fail"),
                        ("/sys/fs/cgroup", "fail"), ("/var/lib/docker/volumes", "fail"),
                        ("/etc/localtime", "pass"), ("/srv/app/data", "pass"), ("./data", "pass"),
                        ("/etcetera", "pass"), ("/etc/nginx", "fail"), ("/etc/ssh", "fail"),
                        ("/home/alice/projects", "pass"), ("/home/alice", "fail"),
                        ("/home/alice/.aws", "fail"), ("~/minecraft_data", "pass"),
                        ("/usr/share/appdata/wireguard/config", "pass"), ("/usr/src", "fail"),
                        ("~/.ssh", "fail"), ("~", "fail"),
                        ("/root/.aws", "fail"), ("/var/lib/postgresql", "fail"),
                        ("/boot/efi", "fail"), ("/dev/bus/usb", "fail"), ("/var", "fail"),
                        ("/var/log/app", "pass"), ("/opt/app/config", "pass")]],
    *[pytest.param("sensitive-mounts",
                   svc(image=image, volumes=[{"type": "bind", "source": src, "target": "/mnt",
                                              "read_only": True}]), None, want,
                   id=f"mount-ro-{src}-{image.split(':')[0]}")
      for src, image, want in [
          ("/etc/ssh", HARDENED["image"], "warn"), ("/proc", HARDENED["image"], "warn"),
          ("/var/run/docker.sock", HARDENED["image"], "fail"),
          ("/var/run/docker.sock", "tecnativa/docker-socket-proxy:0.3@sha256:" + "b" * 64, "warn"),
          ("/var/run/docker.sock", "lscr.io/linuxserver/socket-proxy:1.26.2@sha256:" + "c" * 64,
           "warn")]],
    pytest.param("sensitive-mounts",
                 svc(image="tecnativa/docker-socket-proxy:0.3@sha256:" + "b" * 64,
                     volumes=[{"type": "bind", "source": "/var/run/docker.sock",
                               "target": "/var/run/docker.sock"}]), None, "fail",
                 id="socket-proxy-read-write"),
    pytest.param("sensitive-mounts", svc(volumes=[{"type": "volume", "source": "docker.sock",
                                                   "target": "/x"}]), None, "pass",
                 id="named-volume-called-like-a-socket-without-driver-opts"),
    # capabilities
    pytest.param("capabilities", svc(cap_add=["SYS_ADMIN"]), None, "fail", id="cap-sys-admin"),
    pytest.param("capabilities", svc(cap_add=["cap_net_admin"]), None, "fail", id="cap-lowercase"),
    pytest.param("capabilities", svc(cap_add=["ALL"]), None, "fail", id="cap-all"),
    pytest.param("capabilities", svc(cap_add=["NET_BIND_SERVICE"]), None, "info", id="cap-benign"),
    pytest.param("capabilities", svc(), None, "pass", id="cap-none"),
    # cap_drop ALL
    pytest.param("cap-drop-all", svc(cap_drop=None), None, "warn", id="no-cap-drop"),
    pytest.param("cap-drop-all", svc(cap_drop=["NET_RAW"]), None, "warn", id="cap-drop-some"),
    pytest.param("cap-drop-all", svc(cap_drop=["all"]), None, "pass", id="cap-drop-all-lower"),
    # image pinning
    pytest.param("image-pinning", svc(image="nginx"), None, "warn", id="image-untagged-dev"),
    pytest.param("image-pinning", svc(image="nginx"), "prod", "fail", id="image-untagged-prod"),
    pytest.param("image-pinning", svc(image="nginx:latest"), None, "warn", id="image-latest-dev"),
    pytest.param("image-pinning", svc(image="localhost:5000/app"), None, "warn",
                 id="image-registry-port-untagged"),
    pytest.param("image-pinning", svc(image="nginx:1.27"), None, "pass", id="image-tag-dev"),
    pytest.param("image-pinning", svc(image="nginx:1.27"), "prod", "warn", id="image-tag-prod"),
    pytest.param("image-pinning", svc(image="nginx:1.27"), "production", "warn",
                 id="image-tag-production"),
    pytest.param("image-pinning", svc(image="nginx:latest"), "prod", "fail",
                 id="image-latest-prod"),
    pytest.param("image-pinning", svc(), "prod", "pass", id="image-digest-prod"),
    pytest.param("image-pinning", svc(image="app", build={"context": "."}), "prod", "n/a",
                 id="image-is-the-build-output-tag"),
    pytest.param("image-pinning", svc(image=None, build={"context": "."}), None, "n/a",
                 id="image-build-only"),
    # published ports
    pytest.param("published-ports", svc(ports=[{"target": 80, "published": "8080",
                                                "protocol": "tcp", "mode": "ingress"}]),
                 None, "warn", id="port-all-interfaces"),
    pytest.param("published-ports", svc(ports=[{"target": 80, "published": "8080",
                                                "host_ip": "0.0.0.0"}]),
                 "prod", "warn",
                 id="port-all-interfaces-prod"),
    pytest.param("published-ports", svc(ports=[{"target": 80}]), None, "warn",
                 id="port-ephemeral"),
    pytest.param("published-ports", svc(ports=[{"target": 80, "published": "8080",
                                                "host_ip": "127.0.0.1"}]), "prod", "pass",
                 id="port-loopback"),
    pytest.param("published-ports", svc(), None, "n/a", id="port-none"),
    # resource limits
    pytest.param("resource-limits", svc(deploy=None), None, "warn", id="no-limits"),
    pytest.param("resource-limits", svc(deploy={"resources": {"limits": {"memory": 1024}}}),
                 None, "warn", id="memory-only"),
    pytest.param("resource-limits", svc(deploy={"resources": {"limits": {"cpus": 1}}}),
                 None, "warn", id="cpu-only"),
    pytest.param("resource-limits", svc(), None, "pass", id="both-limits"),
    # run as root
    *[pytest.param("run-as-root", svc(user=user), None, "fail", id=f"user-{user}")
      for user in ("root", "0", "0:0", "root:root")],
    pytest.param("run-as-root", svc(user=None), None, "warn", id="user-unset"),
    pytest.param("run-as-root", svc(user="1000:0"), None, "pass", id="user-nonroot"),
    # read-only root fs
    pytest.param("read-only-rootfs", svc(read_only=None), None, "warn", id="ro-unset"),
    pytest.param("read-only-rootfs", svc(read_only=False), None, "warn", id="ro-false"),
    pytest.param("read-only-rootfs", svc(), None, "pass", id="ro-true"),
    # secrets in environment
    *[pytest.param("secret-env", svc(environment={name: value}), None, want, id=f"env-{name}")
      for name, value, want in [
          ("DB_PASSWORD", "hunter2", "fail"), ("api_token", "abc", "fail"),
          ("SECRET_KEY_BASE", "kq3J9vX0aPz7" * 3, "fail"), ("PRIVATE_KEY", "k", "fail"),
          ("DATABASE_URL", "postgres://app:hunter2@db/app", "fail"),
          ("SOME_ID", "AKIAIOSFODNN7EXAMPLE", "fail"),
          ("GH", "ghp_" + "a" * 36, "fail"),
          ("DB_PASSWORD_FILE", "/run/secrets/db", "pass"), ("DB_PASSWORD", None, "pass"),
          ("DB_PASSWORD", "", "pass"), ("TOKEN_TTL", "3600", "pass"),
          ("AUTH_TOKEN", "/run/secrets/token", "pass"), ("LOG_LEVEL", "debug", "pass"),
          ("DATABASE_URL", "postgres://db/app", "pass")]],
    # healthcheck
    pytest.param("healthcheck", svc(healthcheck=None), None, "warn", id="hc-missing"),
    pytest.param("healthcheck", svc(healthcheck={"disable": True}), None, "warn", id="hc-disabled"),
    pytest.param("healthcheck", svc(healthcheck={"test": ["NONE"]}), None, "warn", id="hc-none"),
    pytest.param("healthcheck", svc(), None, "pass", id="hc-present"),
    # restart: always without limits
    pytest.param("restart-without-limits", svc(restart="always", deploy=None), None, "info",
                 id="restart-always-no-limits"),
    pytest.param("restart-without-limits", svc(restart="always"), None, "pass",
                 id="restart-always-limits"),
    pytest.param("restart-without-limits", svc(restart="unless-stopped", deploy=None), None,
                 "n/a", id="restart-unless-stopped"),
    # devices
    pytest.param("devices", svc(devices=[{"source": "/dev/net/tun", "target": "/dev/net/tun",
                                          "permissions": "rwm"}]), None, "warn", id="dev-tun"),
    pytest.param("devices", svc(devices=[{"source": "/dev/mem", "target": "/dev/mem"}]), None,
                 "fail", id="dev-mem"),
    pytest.param("devices", svc(devices=[{"source": "/dev/sda", "target": "/dev/sda"}]), None,
                 "fail", id="dev-disk"),
    pytest.param("devices", svc(), None, "pass", id="dev-none"),
    # security_opt
    *[pytest.param("security-opt", svc(security_opt=[opt]), None, want, id=f"secopt-{opt}")
      for opt, want in [("seccomp:unconfined", "fail"), ("seccomp=unconfined", "fail"),
                        ("apparmor:unconfined", "fail"), ("label:disable", "fail"),
                        ("label=disable", "fail"), ("systempaths=unconfined", "fail"),
                        ("no-new-privileges:false", "pass"), ("no-new-privileges:true", "pass"),
                        ("seccomp=/etc/profile.json", "pass"), ("label=type:svirt_t", "pass")]],
    # no-new-privileges: explicit false fails everywhere, missing warns (in prod too)
    *[pytest.param("no-new-privileges", svc(security_opt=opts), env, want,
                   id=f"nnp-{'+'.join(opts) or 'none'}-{env}")
      for opts, env, want in [
          (["no-new-privileges:false"], None, "fail"), (["no-new-privileges=false"], None, "fail"),
          ([], None, "warn"), ([], "prod", "warn"), (["seccomp=/p.json"], None, "warn"),
          (["no-new-privileges"], "prod", "pass"), (["no-new-privileges=true"], "prod", "pass"),
          (["NO-NEW-PRIVILEGES:TRUE"], "prod", "pass")]],
    pytest.param("security-opt-missing", svc(security_opt=None), None, "info", id="secopt-absent"),
    pytest.param("security-opt-missing", svc(), None, "pass", id="secopt-present"),
    # host user namespace
    pytest.param("host-userns", svc(userns_mode="host"), None, "fail", id="userns-host"),
    pytest.param("host-userns", svc(), None, "pass", id="userns-default"),
    # bind propagation
    *[pytest.param("bind-propagation",
                   svc(volumes=[{"type": "bind", "source": "./d", "target": "/d",
                                 "bind": {"propagation": mode}}]), None, want, id=f"prop-{mode}")
      for mode, want in [("shared", "fail"), ("rshared", "fail"), ("slave", "warn"),
                         ("rslave", "warn"), ("rprivate", "pass"), ("private", "pass")]],
    pytest.param("bind-propagation", svc(), None, "n/a", id="prop-no-binds"),
    # pids limit
    pytest.param("pids-limit", svc(deploy={"resources": {"limits": {"memory": 1, "cpus": 1}}}),
                 None, "warn", id="pids-missing"),
    pytest.param("pids-limit", svc(deploy={"resources": {"limits": {"memory": 1, "cpus": 1,
                                                                    "pids": -1}}}),
                 None, "warn", id="pids-unlimited"),
    pytest.param("pids-limit", svc(), None, "pass", id="pids-set"),
    # cgroup
    pytest.param("cgroup", svc(cgroup="host"), None, "fail", id="cgroup-host"),
    pytest.param("cgroup", svc(cgroup_parent="/custom"), None, "warn", id="cgroup-parent"),
    pytest.param("cgroup", svc(cgroup="private"), None, "pass", id="cgroup-private"),
    # privileged ports
    pytest.param("privileged-ports", svc(ports=[{"target": 80, "published": "80",
                                                 "host_ip": "127.0.0.1"}]), None, "pass",
                 id="web-port-80"),
    pytest.param("privileged-ports", svc(cap_drop=None, ports=[{"target": 443}]), None, "pass",
                 id="low-container-port-unpublished-host-side"),
    pytest.param("privileged-ports", svc(ports=[{"target": 53, "published": "53",
                                                 "protocol": "udp"}]), None, "pass",
                 id="dns-port-53"),
    pytest.param("privileged-ports", svc(ports=[{"target": 8000, "published": "70"}]), None,
                 "info", id="low-host-port-70"),
    pytest.param("privileged-ports", svc(ports=[{"target": 21, "published": "21"}]), None,
                 "info", id="low-host-port-21"),
    pytest.param("privileged-ports", svc(ports=[{"target": 8080, "published": "8080"}]), None,
                 "pass", id="high-host-port"),
    pytest.param("privileged-ports", svc(), None, "n/a", id="no-ports"),
    # waivers (the file's x-controlplane-waivers: test_waivers_* below and in test_cli.py)
    pytest.param("waivers", svc(), None, "n/a", id="no-waivers"),
    # restart on-failure without a maximum
    pytest.param("restart-max-attempts", svc(restart="on-failure"), None, "info",
                 id="on-failure-forever"),
    pytest.param("restart-max-attempts", svc(restart="on-failure:5"), None, "pass",
                 id="on-failure-5"),
    pytest.param("restart-max-attempts",
                 svc(deploy={"restart_policy": {"condition": "on-failure"}}), None, "info",
                 id="deploy-on-failure-forever"),
    pytest.param("restart-max-attempts",
                 svc(deploy={"restart_policy": {"condition": "on-failure", "max_attempts": 3}}),
                 None, "pass", id="deploy-on-failure-3"),
    pytest.param("restart-max-attempts", svc(restart="always"), None, "n/a", id="restart-always"),
    # default network only
    pytest.param("default-network", svc(networks=None), None, "info", id="default-net"),
    pytest.param("default-network", svc(), None, "pass", id="named-net"),
    pytest.param("default-network", svc(networks=None, network_mode="none"), None, "n/a",
                 id="network-mode-none"),
]


@pytest.mark.parametrize(("rule", "service", "env", "want"), CASES)
def test_rule(check: Check, rule: str, service: dict[str, Any], env: str | None,
              want: str) -> None:
    report = check({"svc": service}, env=env)
    got = cell(report, "svc", rule)
    assert got["result"] == want, got
    # A non-pass cell has findings carrying rationale, remediation and a pointer into fields.
    findings = [f for f in report["findings"] if f["rule"] == rule]
    assert bool(findings) == (want not in ("pass", "n/a"))
    for finding in findings:
        assert finding["pointer"].startswith("/services/svc")
        assert finding["rationale"] and finding["remediation"]


def test_hardened_service_passes_every_rule_in_prod(check: Check) -> None:
    report = check({"svc": svc()}, env="prod", strict=True)
    assert report["passed"] is True
    assert {c["result"] for c in report["matrix"]} <= {"pass", "n/a"}


def test_an_image_another_service_builds_has_nothing_to_pin(check: Check) -> None:
    # Evaluated in several chunks: the builder is in the first, its users in the last.
    from service.compose.preflight import CHUNK_SERVICES

    services = {"builder": svc(image="app-local", build={"context": "."})}
    services.update({f"filler{i}": svc() for i in range(CHUNK_SERVICES)})
    services["worker"] = svc(image="app-local")
    services["other"] = svc(image="app-other")
    report = check(services, env="prod")
    assert cell(report, "builder", "image-pinning")["result"] == "n/a"
    assert cell(report, "worker", "image-pinning")["result"] == "n/a"
    assert cell(report, "other", "image-pinning")["result"] == "fail"


def test_secret_env_precision(check: Check) -> None:
    """Placeholders and harmless values pass, hashes are info, real-looking secrets fail."""
    env = {"A_PASSWORD": "changeme", "B_PASSWORD": '"0"', "WIREGUARD_PRIVATE_KEY": "<PrivateKey>",
           "C_PASSWORD": "ChooseYourOwnPasswordHere1234", "API_KEY": "invalid",
           "D_TOKEN": "your_token_here", "E_SECRET": "xxxxxxxx", "F_PASSWORD": "false",
           "ADMIN_PASSWORD_HASH": "$2a$14$1l.IozJx7xQRVmlkEQ32OeEEfP5mRxTpbDTCTcXRqn19gXD8YK1pW",
           "ARGON_HASH_PASSWORD": "$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA",
           "G_PASSWORD": "nextcloud", "H_TOKEN": "f3b1c9a0e6d24a7b9c1d2e3f4a5b6c7d"}
    report = check({"svc": svc(environment=env)})
    got = {f["pointer"].rsplit("/", 1)[1]: f["severity"] for f in report["findings"]
           if f["rule"] == "secret-env"}
    assert got == {"ADMIN_PASSWORD_HASH": "info", "ARGON_HASH_PASSWORD": "info",
                   "G_PASSWORD": "fail", "H_TOKEN": "fail"}


def test_named_volume_binding_a_sensitive_host_path(check: Check) -> None:
    report = check(
        {"svc": svc(volumes=[{"type": "volume", "source": "hostetc", "target": "/mnt"}])},
        volumes={"hostetc": {"driver": "local",
                             "driver_opts": {"type": "none", "o": "bind", "device": "/etc"}}},
    )
    assert cell(report, "svc", "sensitive-mounts")["result"] == "fail"
    [finding] = [f for f in report["findings"] if f["rule"] == "sensitive-mounts"]
    assert finding["pointer"] == "/volumes/hostetc/driver_opts/device"


def test_secret_values_never_appear_in_the_report(check: Check) -> None:
    report = check({"svc": svc(environment={"DB_PASSWORD": "hunter2-very-secret"})})
    assert "hunter2-very-secret" not in repr(report)


def test_rule_catalogue_is_complete(rules: object) -> None:
    from service.compose.preflight import RuleSet

    assert isinstance(rules, RuleSet)
    ids = {rule.id for rule in rules.rules}
    assert len(ids) >= 15
    assert {case.values[0] for case in CASES} == ids  # every rule is tested above
    for rule in rules.rules:
        assert rule.error is None, rule
        assert rule.severity in ("fail", "warn", "info")
        assert rule.title and rule.rationale and rule.remediation


def test_waivers_in_fields(check: Check) -> None:
    waivers = [{"rule": "privileged", "service": "svc", "reason": "raw devices"},
               {"rule": "run-as-root", "service": "svc"},
               {"rule": "privileged", "service": "not-in-the-file"}]
    report = check({"svc": svc(privileged=True, user="root")},
                   **{"x-controlplane-waivers": waivers})
    assert cell(report, "svc", "privileged") == {
        "service": "svc", "rule": "privileged", "result": "pass",
        "message": "waived: raw devices", "waived": True}
    assert cell(report, "svc", "run-as-root")["result"] == "fail"  # no reason: not waived
    assert cell(report, "svc", "waivers")["message"] == "waiver of run-as-root has no reason"
    assert report["summary"]["waived"] == 1 and report["passed"] is False
