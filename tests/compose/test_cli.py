"""``cpctl compose``: check (table/json/junit/sarif, offline, --server), normalize, exit codes."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest

from service.cli.compose import run
from service.compose.normalize import normalize_files
from service.compose.preflight import RuleSet, evaluate
from tests.compose.support import EXAMPLES

RISKY = str(EXAMPLES / "risky.compose.yaml")
GOOD = str(EXAMPLES / "good.compose.yaml")


def cli(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run(list(argv), stdout=out, stderr=err, environ=environ or {})
    return code, out.getvalue(), err.getvalue()


def test_json_output_is_exactly_the_evaluate_report(rules: RuleSet) -> None:
    code, out, _ = cli("check", RISKY, "--env", "prod", "--format", "json")
    fields = normalize_files([Path(RISKY)], environ={})
    assert json.loads(out) == evaluate(fields, strict=False, env="prod", rules=rules)
    assert code == 1


def test_exit_codes_and_strict() -> None:
    assert cli("check", GOOD, "--env", "prod", "--strict")[0] == 0
    multi = [str(EXAMPLES / "multi.compose.yaml"), str(EXAMPLES / "multi.override.yaml")]
    assert cli("check", *multi)[0] == 0
    assert cli("check", *multi, "--strict")[0] == 1
    code, _, err = cli("check", str(EXAMPLES / "nope.yaml"))
    assert code == 2 and "cannot read" in err
    assert cli("check")[0] == 2  # argparse usage error


def test_table_output_is_a_readable_matrix() -> None:
    code, out, _ = cli("check", RISKY)
    assert code == 1
    assert out.splitlines()[0].split() == ["rule", "agent", "web"]
    assert any(line.split() == ["cap-drop-all", "warn", "warn"] for line in out.splitlines())
    assert "NOT PASSED" in out and "[privileged] privileged: true" in out


def test_junit_is_valid_xml_with_failures() -> None:
    _, out, _ = cli("check", RISKY, "--format", "junit")
    root = ET.fromstring(out.split("\n", 1)[1])  # noqa: S314 - our own output
    assert root.tag == "testsuites"
    assert {s.get("name") for s in root.iter("testsuite")} == {"agent", "web"}
    failures = [case.get("name") for case in root.iter("testcase")
                if case.find("failure") is not None]
    assert "privileged" in failures
    assert int(root.get("tests", "0")) == len(list(root.iter("testcase")))
    assert int(root.get("failures", "0")) == len(failures)


def test_sarif_2_1_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES.parents[1])  # the repository: SRCROOT
    _, out, _ = cli("check", RISKY, "--format", "sarif", "--env", "prod")
    sarif = json.loads(out)
    assert sarif["runs"][0]["originalUriBaseIds"] == {
        "SRCROOT": {"uri": EXAMPLES.parents[1].as_uri() + "/"}}
    assert sarif["version"] == "2.1.0"
    run_ = sarif["runs"][0]
    rule_ids = [r["id"] for r in run_["tool"]["driver"]["rules"]]
    assert len(rule_ids) >= 15
    for result in run_["results"]:
        assert result["level"] in ("error", "warning", "note")
        assert rule_ids[result["ruleIndex"]] == result["ruleId"]
        location = result["locations"][0]
        assert location["physicalLocation"]["artifactLocation"] == {
            "uri": "examples/compose/risky.compose.yaml", "uriBaseId": "SRCROOT"}
        assert location["logicalLocations"][0]["fullyQualifiedName"].startswith("/services/")


def test_normalize_prints_the_fields() -> None:
    code, out, _ = cli("normalize", str(EXAMPLES / "interpolation.compose.yaml"),
                       "--env-file", str(EXAMPLES / "interpolation.env"))
    assert code == 0
    db = json.loads(out)["services"]["db"]
    assert db["image"] == "postgres:16.3"
    assert db["ports"][0] == {"target": 5432, "published": "5433", "host_ip": "127.0.0.1",
                              "protocol": "tcp", "mode": "ingress"}


def test_missing_required_variable_is_exit_2() -> None:
    code, _, err = cli("check", str(EXAMPLES / "interpolation.compose.yaml"),
                       "--env-file", "/dev/null")
    assert code == 2 and "DB_PASSWORD must be set" in err


# --- --server --------------------------------------------------------------------------------

@pytest.fixture
def server(rules: RuleSet) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in endpoint that answers with evaluate(), recording what it received."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"),
                         "body": body})
            if self.headers.get("Authorization") != "Bearer t0k":
                self.send_response(401)
                self.end_headers()
                self.wfile.write(b'{"code": "unauthenticated"}')
                return
            report = evaluate(body["fields"], strict=body.get("strict", False),
                              env=body.get("env"), rules=rules)
            data = json.dumps(report).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_server_mode_posts_the_body_with_the_token(
    server: tuple[str, list[dict[str, Any]]]
) -> None:
    url, seen = server
    offline = cli("check", RISKY, "--env", "prod", "--format", "json")
    remote = cli("check", RISKY, "--env", "prod", "--format", "json", "--server", url,
                 environ={"CONTROLPLANE_TOKEN": "t0k"})
    assert remote == offline
    assert seen[0]["path"] == "/api/v1/compose/import"
    assert seen[0]["auth"] == "Bearer t0k"
    assert set(seen[0]["body"]) == {"fields", "strict", "env"}
    code, _, err = cli("check", RISKY, "--server", url, "--token", "wrong")
    assert code == 2 and "401" in err


def test_secret_env_judges_the_file_and_reports_the_dotenv_at_its_line(tmp_path: Path) -> None:
    """A ``${VAR}`` reference is no literal, whatever the shell or the .env hold; a secret in
    the .env beside the file is its own finding at the .env's line (warn)."""
    (tmp_path / "compose.yaml").write_text(
        "services:\n  db:\n    image: postgres:16\n    environment:\n"
        "      POSTGRES_PASSWORD: ${DB_PASSWORD}\n      OTHER_PASSWORD: hunter2xyz\n")
    (tmp_path / ".env").write_text("# local settings\nDB_PASSWORD=s3cr3tvalue99\n")
    path = str(tmp_path / "compose.yaml")
    for environ in ({}, {"DB_PASSWORD": "from-the-shell-99"}):
        code, out, _ = cli("check", path, "--format", "json", environ=environ)
        assert code == 1
        found = {(f["pointer"], f["severity"], f["message"])
                 for f in json.loads(out)["findings"] if f["rule"] == "secret-env"}
        assert found == {
            ("/services/db/environment/OTHER_PASSWORD", "fail",
             "environment OTHER_PASSWORD holds a literal secret value"),
            ("/.env/DB_PASSWORD", "warn",
             "environment POSTGRES_PASSWORD: secret committed in .env (DB_PASSWORD)")}
    code, out, _ = cli("check", path)
    assert f"secret committed in .env (DB_PASSWORD)  ({tmp_path / '.env'}:2:1)" in out
    # without the .env and without the literal, the file passes secret-env
    (tmp_path / ".env").unlink()
    (tmp_path / "compose.yaml").write_text(
        "services:\n  db:\n    image: postgres:16\n    environment:\n"
        "      POSTGRES_PASSWORD: ${DB_PASSWORD}\n")
    code, out, _ = cli("check", path, "--format", "json", environ={"DB_PASSWORD": "s3cr3t99"})
    assert code == 0
    assert [f for f in json.loads(out)["findings"] if f["rule"] == "secret-env"] == []


WAIVED = """\
services:
  app:
    image: nginx:1.27
    privileged: true
    volumes: ["/etc/nginx:/etc/nginx"]
x-controlplane-waivers:
  - rule: sensitive-mounts
    service: app
    reason: reads its config from the host (OPS-12)
    expires: 2099-12-31
  - rule: privileged
    service: app
    reason: raw devices (OPS-13)
"""


def test_waivers_mark_findings_and_policy_decides_prod(tmp_path: Path) -> None:
    """A valid waiver keeps its finding visible (waived + reason, SARIF suppression, JUnit
    skipped) and lifts its cell; privileged may not be waived in prod (waivers.rego)."""
    path = tmp_path / "compose.yaml"
    path.write_text(WAIVED)
    code, out, _ = cli("check", str(path), "--format", "json")
    report = json.loads(out)
    assert code == 0 and report["summary"]["waived"] == 2
    waived = {f["rule"]: f["waiver"] for f in report["findings"] if f.get("waived")}
    assert waived == {"sensitive-mounts": {"reason": "reads its config from the host (OPS-12)",
                                           "expires": "2099-12-31"},
                      "privileged": {"reason": "raw devices (OPS-13)"}}
    cells = {c["rule"]: c for c in report["matrix"]}
    assert cells["privileged"]["result"] == "pass" and cells["privileged"]["waived"] is True
    assert cells["waivers"]["result"] == "pass"

    _, out, _ = cli("check", str(path), "--format", "sarif")
    results = json.loads(out)["runs"][0]["results"]
    suppressed = {r["ruleId"]: r["suppressions"] for r in results if "suppressions" in r}
    assert suppressed["privileged"] == [{"kind": "inSource", "status": "accepted",
                                         "justification": "raw devices (OPS-13)"}]
    _, out, _ = cli("check", str(path), "--format", "junit")
    case = ET.fromstring(out.split("\n", 1)[1]).find(  # noqa: S314 - our own output
        ".//testcase[@name='privileged']")
    assert case is not None and case.find("skipped") is not None
    assert case.find("skipped").get("message") == "waived: raw devices (OPS-13)"

    code, out, _ = cli("check", str(path), "--format", "json", "--env", "prod")
    report = json.loads(out)
    assert code == 1
    assert {c["rule"]: c["result"] for c in report["matrix"]}["privileged"] == "fail"
    assert [(f["message"], f["pointer"]) for f in report["findings"] if f["rule"] == "waivers"] == [
        ("privileged may not be waived in prod", "/x-controlplane-waivers/1")]
    assert [f["rule"] for f in report["findings"] if f.get("waived")] == ["sensitive-mounts"]


@pytest.mark.parametrize(("waiver", "message"), [
    pytest.param("    reason: ok\n    expires: 2020-01-01\n",
                 "waiver of sensitive-mounts expired on 2020-01-01", id="expired-date"),
    pytest.param("    reason: ok\n    expires: '2020-01-01T10:00:00Z'\n",
                 "waiver of sensitive-mounts expired on 2020-01-01T10:00:00Z", id="expired-time"),
    pytest.param("    expires: 2099-01-01\n", "waiver of sensitive-mounts has no reason",
                 id="no-reason"),
    pytest.param("    reason: '  '\n", "waiver of sensitive-mounts has no reason",
                 id="blank-reason"),
    pytest.param("    reason: ok\n    expires: next week\n",
                 "waiver of sensitive-mounts: expires is not an RFC 3339 date or date-time: "
                 "next week", id="bad-expiry"),
])
def test_a_waiver_that_lifts_nothing_is_a_finding(tmp_path: Path, waiver: str,
                                                   message: str) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text("services:\n  app:\n    image: nginx:1.27\n"
                    "    volumes: ['/etc/nginx:/etc/nginx']\nx-controlplane-waivers:\n"
                    "  - rule: sensitive-mounts\n    service: app\n" + waiver)
    code, out, _ = cli("check", str(path), "--format", "json")
    report = json.loads(out)
    assert code == 1
    assert [f["message"] for f in report["findings"] if f["rule"] == "waivers"] == [message]
    assert {c["rule"]: c["result"] for c in report["matrix"]}["sensitive-mounts"] == "fail"
    assert not any(f.get("waived") for f in report["findings"])
    code, out, _ = cli("check", str(path))
    assert f"({path}:6:5)" in out  # the waiver's own line


def test_a_waiver_without_rule_or_service_is_unusable_input(tmp_path: Path) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text("services:\n  app:\n    image: nginx:1.27\nx-controlplane-waivers:\n"
                    "  - rule: privileged\n    reason: r\n")
    code, out, err = cli("check", str(path))
    assert code == 2 and out == ""
    assert "x-controlplane-waivers/0: a waiver needs service" in err


def test_sarif_uris_are_percent_encoded_and_relative_to_srcroot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "my app #2"
    folder.mkdir()
    (folder / "compose file.yaml").write_text("services:\n  web:\n    privileged: true\n")
    monkeypatch.chdir(tmp_path)
    _, out, _ = cli("check", "my app #2/compose file.yaml", "--format", "sarif")
    run_ = json.loads(out)["runs"][0]
    assert run_["originalUriBaseIds"]["SRCROOT"]["uri"] == tmp_path.as_uri() + "/"
    locations = {json.dumps(r["locations"][0]["physicalLocation"]["artifactLocation"])
                 for r in run_["results"]}
    assert locations == {json.dumps({"uri": "my%20app%20%232/compose%20file.yaml",
                                     "uriBaseId": "SRCROOT"})}
    # a file outside the working directory: an absolute file: URI, encoded
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    _, out, _ = cli("check", str(folder / "compose file.yaml"), "--format", "sarif")
    (first, *_) = json.loads(out)["runs"][0]["results"]
    assert first["locations"][0]["physicalLocation"]["artifactLocation"] == {
        "uri": (folder / "compose file.yaml").as_uri()}
    assert first["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith(
        "/my%20app%20%232/compose%20file.yaml")


def test_version_and_compose_check_import_no_other_command_group(tmp_path: Path) -> None:
    """``cpctl --version`` and ``cpctl compose check`` load neither aiohttp nor the other
    command groups nor the service configuration (a process each; nothing timed here: the
    figures are bench/compose_bench.py --cli-only's)."""
    import subprocess
    import sys

    from tests.compose.support import REPO

    path = tmp_path / "compose.yaml"
    path.write_text("services:\n  web:\n    image: nginx:1.27\n")
    script = (
        "import contextlib, io, sys\n"
        "from service.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(sys.argv[1:])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ['aiohttp', 'service.config', 'service.cli.serve', 'service.cli.policy',\n"
        "         'service.cli.approval', 'urllib.request']\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n")
    for argv in (["--version"], ["compose", "check", str(path), "--env-file", "/dev/null"]):
        result = subprocess.run([sys.executable, "-c", script, *argv], cwd=REPO,
                                capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().splitlines()[-1] == "[]", (argv, result.stdout)
