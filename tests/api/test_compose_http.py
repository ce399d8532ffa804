"""POST /api/v1/compose/import: the endpoint and `cpctl compose check` give identical reports."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from service.cli import compose as compose_cli
from service.compose.normalize import normalize_files
from tests.auth import bearer, login
from tests.problems import assert_problem

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "compose"
CASES = [
    pytest.param(["good.compose.yaml"], id="good"),
    pytest.param(["risky.compose.yaml"], id="risky"),
    pytest.param(["multi.compose.yaml", "multi.override.yaml"], id="multi-file"),
    pytest.param(["anchors.compose.yaml"], id="anchors"),
]


@pytest.mark.parametrize("files", CASES)
@pytest.mark.parametrize("strict", [False, True])
async def test_endpoint_and_cli_reports_are_identical(client, files, strict):
    paths = [EXAMPLES / name for name in files]
    argv = [*map(str, paths), "--env", "prod", "--format", "json", *(["--strict"] if strict else [])]
    out = io.StringIO()
    code = compose_cli.run(["check", *argv], stdout=out, stderr=io.StringIO(), environ={})
    cli_report = json.loads(out.getvalue())
    assert code == (0 if cli_report["passed"] else 1)

    token = await login(client, "carol")
    fields = normalize_files(paths, environ={})
    response = await client.post("/api/v1/compose/import", headers=bearer(token),
                                 json={"fields": fields, "strict": strict, "env": "prod"})
    assert response.status == 200  # also when passed is false
    assert await response.json() == cli_report


async def test_risky_file_fails_with_findings_and_pointers(client):
    token = await login(client, "carol")
    fields = normalize_files([EXAMPLES / "risky.compose.yaml"], environ={})
    report = await (await client.post("/api/v1/compose/import", headers=bearer(token),
                                      json={"fields": fields, "env": "prod"})).json()
    assert report["passed"] is False and report["summary"]["fail"] > 0
    assert all(f["pointer"].startswith("/services/") for f in report["findings"] if "pointer" in f)


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        pytest.param({}, "", id="fields-missing"),
        pytest.param({"fields": {"services": {"web": {"ports": ["80:80"]}}}},
                     "/fields/services/web/ports/0", id="short-port-syntax"),
        pytest.param({"fields": {"services": {}}, "strict": "yes"}, "/strict", id="strict-type"),
        pytest.param({"fields": {"services": {}}, "deploy": True}, "", id="unknown-field"),
    ],
)
async def test_bad_bodies_are_422_with_pointers(client, body, pointer):
    token = await login(client, "carol")
    response = await client.post("/api/v1/compose/import", headers=bearer(token), json=body)
    problem = await assert_problem(response, 422, "schema_validation_failed")
    assert pointer in {e["pointer"] for e in problem["errors"]}


async def test_a_repeated_file_gets_the_same_bytes_and_a_bad_body_stays_bad(client):
    token = await login(client, "carol")
    fields = normalize_files([EXAMPLES / "risky.compose.yaml"], environ={})
    body = json.dumps({"fields": fields, "env": "prod"})
    headers = {**bearer(token), "Content-Type": "application/json"}
    answers = []
    for _ in range(3):  # evaluated, then the cached report's text, then again
        response = await client.post("/api/v1/compose/import", headers=headers, data=body)
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/json; charset=utf-8"
        answers.append(await response.read())
    assert answers[0] == answers[1] == answers[2]
    assert json.loads(answers[0])["passed"] is False
    # A body that failed its checks is checked again every time (only passes are remembered).
    bad = json.dumps({"fields": fields, "strict": "yes"})
    for _ in range(2):
        response = await client.post("/api/v1/compose/import", headers=headers, data=bad)
        await assert_problem(response, 422, "schema_validation_failed")


async def test_compose_import_needs_a_caller_and_deploys_nothing(client):
    await assert_problem(await client.post("/api/v1/compose/import", json={"fields": {}}), 401,
                         "unauthenticated")


def _services(count: int) -> dict[str, object]:
    return {f"svc{i}": {"image": "nginx", "restart": "always", "cap_add": ["NET_ADMIN"],
                        "ports": [{"target": 1, "target_end": 65535, "published": "1-65535",
                                   "protocol": "tcp", "mode": "ingress"}],
                        "environment": {"DB_PASSWORD": "hunter2hunter2"}}
            for i in range(count)}


async def test_over_the_size_budget_is_422_compose_too_large(client):
    token = await login(client, "carol")
    fields = {"services": {f"s{i}": {"image": "a:1"} for i in range(1001)}}
    response = await client.post("/api/v1/compose/import", headers=bearer(token),
                                 json={"fields": fields})
    body = await assert_problem(response, 422, "compose_too_large")
    assert body["errors"][0]["pointer"] == "/fields/services"


async def test_a_large_check_does_not_block_the_worker(client):
    """500 services with a 65,535-port range each: answered, and /healthz meanwhile."""
    import asyncio
    import time

    token = await login(client, "carol")
    started = time.monotonic()
    big = asyncio.ensure_future(client.post(
        "/api/v1/compose/import", headers=bearer(token),
        json={"fields": {"services": _services(500)}, "env": "prod"}))
    await asyncio.sleep(0.05)  # the import is under way (parsed, evaluating in its thread)
    health = await client.get("/healthz")
    health_at = time.monotonic() - started
    assert health.status == 200
    response = await big
    done_at = time.monotonic() - started
    assert response.status == 200
    report = await response.json()
    assert report["summary"]["services"] == 500 and not report["passed"]
    assert health_at < 5.0 or health_at < done_at, (health_at, done_at)
    assert done_at < 120.0  # safety net only (a stall is minutes; a busy shared box is slow)


async def test_a_65535_port_range_is_one_finding_over_http(client):
    token = await login(client, "carol")
    fields = normalize_files([EXAMPLES / "risky.compose.yaml"], environ={})
    fields["services"]["web"]["ports"] = [{"target": 1, "target_end": 65535,
                                           "published": "1-65535", "protocol": "tcp",
                                           "mode": "ingress"}]
    response = await client.post("/api/v1/compose/import", headers=bearer(token),
                                 json={"fields": fields, "env": "prod"})
    assert response.status == 200
    ports = [f for f in (await response.json())["findings"] if f["rule"] == "published-ports"]
    assert [f["message"] for f in ports] == [
        "port 1-65535/tcp published on all interfaces as 1-65535"]


async def test_over_the_time_budget_is_422_and_other_checks_are_served_meanwhile(
    client, monkeypatch
):
    """A report over its time budget is abandoned between chunks of services (422
    evaluation_budget_exceeded); a small check sent while it runs is answered first."""
    import asyncio
    import time

    from service.compose import preflight

    # 600 such services take ~0.9 CPU-s here: a budget of a quarter of that is over on any
    # host, while the small check (one service, a few ms) stays well within it.
    monkeypatch.setattr(preflight, "EVALUATION_BUDGET_S", 0.25)
    token = await login(client, "carol")
    started = time.monotonic()
    big = asyncio.ensure_future(client.post(
        "/api/v1/compose/import", headers=bearer(token),
        json={"fields": {"services": _services(600)}, "env": "staging"}))
    await asyncio.sleep(0.05)
    small = await client.post("/api/v1/compose/import", headers=bearer(token),
                              json={"fields": {"services": _services(1)}, "env": "staging"})
    small_at = time.monotonic() - started
    assert small.status == 200
    response = await big
    big_at = time.monotonic() - started
    problem = await assert_problem(response, 422, "evaluation_budget_exceeded")
    assert "split the file" in problem["detail"]
    assert problem["errors"][0]["pointer"] == "/fields/services"
    assert small_at < big_at, (small_at, big_at)  # answered while the large one ran


async def test_waivers_over_http_are_the_files_and_the_same_as_the_cli(client, tmp_path):
    """The waivers travel under fields (they are part of the file); the report equals the CLI's,
    for a valid waiver, a reason-less one and one the policy refuses in prod."""
    path = tmp_path / "compose.yaml"
    path.write_text(
        "services:\n  app:\n    image: nginx:1.27\n    privileged: true\n"
        "    volumes: ['/etc/nginx:/etc/nginx']\n    cap_add: [SYS_ADMIN]\n"
        "x-controlplane-waivers:\n"
        "  - {rule: sensitive-mounts, service: app, reason: config (OPS-12), expires: 2099-12-31}\n"
        "  - {rule: privileged, service: app, reason: raw devices}\n"
        "  - {rule: capabilities, service: app}\n")
    token = await login(client, "carol")
    fields = normalize_files([path], environ={})
    assert fields["x-controlplane-waivers"][0] == {
        "rule": "sensitive-mounts", "service": "app", "reason": "config (OPS-12)",
        "expires": "2099-12-31"}
    for env in ("dev", "prod"):
        out = io.StringIO()
        compose_cli.run(["check", str(path), "--env", env, "--format", "json"], stdout=out,
                        stderr=io.StringIO(), environ={})
        response = await client.post("/api/v1/compose/import", headers=bearer(token),
                                     json={"fields": fields, "env": env})
        assert response.status == 200
        report = await response.json()
        assert report == json.loads(out.getvalue())
        problems = sorted(f["message"] for f in report["findings"] if f["rule"] == "waivers")
        waived = sorted(f["rule"] for f in report["findings"] if f.get("waived"))
        if env == "dev":
            assert problems == ["waiver of capabilities has no reason"]
            assert waived == ["privileged", "sensitive-mounts"]
        else:
            assert problems == ["privileged may not be waived in prod",
                                "waiver of capabilities has no reason"]
            assert waived == ["sensitive-mounts"]


async def test_a_malformed_waiver_over_http_is_422(client):
    token = await login(client, "carol")
    response = await client.post(
        "/api/v1/compose/import", headers=bearer(token),
        json={"fields": {"services": {"a": {"image": "a:1"}},
                         "x-controlplane-waivers": [{"rule": "privileged", "reason": "r"}]}})
    problem = await assert_problem(response, 422, "schema_validation_failed")
    assert any(e["pointer"] == "/fields/x-controlplane-waivers/0" for e in problem["errors"])
