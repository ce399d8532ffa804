"""Hostile compose files against ``cpctl compose`` and the endpoint: the exit-code contract
(0 passed, 1 not passed, 2 unusable input on one line, 3 internal error), alias bombs, deep
nesting, bytes that are not UTF-8, control characters in JUnit, quotes and backslashes in values.

The CLI runs as a real process (``python -m service``, the worktree's code) wherever the exit
code and the lines on stderr are what is tested.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest

from service.cli import compose as compose_cli
from service.compose.normalize import NormalizeError
from service.compose.preflight import RuleSet, evaluate
from service.compose.source import (
    MAX_INTERPOLATED_CHARS,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    load_yaml,
)
from service.rego import Module, compile_bundle
from tests.auth import bearer, login
from tests.compose.support import REPO

#: A generous bound on one CLI run: each of these answers in about a second; the unbounded
#: ones ran past 120 s.
RUN_TIMEOUT_S = 120


def cpctl(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "CONTROLPLANE_DEBUG"}
    return subprocess.run([sys.executable, "-m", "service", "compose", *argv], cwd=REPO,
                          env={**environ, **(env or {})}, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr[:2000]
    assert "Traceback" not in stderr
    return lines[0]


# --- billion laughs -----------------------------------------------------------------------

def laughs(levels: int = 8) -> str:
    """Anchors ``&l0``..``&l{levels}``, each nine aliases of the one before: 9**(levels+1)
    scalars once expanded (9**9 = 387,420,489 for the default), in a few hundred bytes."""
    lines = ['x-l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels + 1):
        lines.append(f"x-l{level}: &l{level} [{','.join([f'*l{level - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


LAST = "*l8"
BOMBS = {
    "command": f"services:\n  web:\n    image: nginx:1.25\n    command: {LAST}\n",
    "labels": f"services:\n  web:\n    image: nginx:1.25\n    labels:\n      a: {LAST}\n",
    "build.args": f"services:\n  web:\n    build:\n      context: .\n      args:\n"
                  f"        A: {LAST}\n",
    "deploy.labels": f"services:\n  web:\n    image: nginx:1.25\n    deploy:\n      labels:\n"
                     f"        a: {LAST}\n",
    "driver_opts": f"services:\n  web:\n    image: nginx:1.25\nnetworks:\n  n:\n"
                   f"    driver_opts:\n      o: {LAST}\n",
}


@pytest.mark.parametrize("field", sorted(BOMBS))
def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path: Path, field: str) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(laughs() + BOMBS[field])
    assert path.stat().st_size < 1000
    result = cpctl("check", str(path))
    assert result.returncode == 2, result.stderr[:2000]
    line = one_line(result.stderr)
    assert line.startswith(f"cpctl compose: {path}:")
    assert f"over {MAX_YAML_NODES} YAML nodes" in line
    assert result.stdout == ""


def test_the_composer_counts_an_alias_at_the_size_of_what_it_refers_to() -> None:
    # Nothing is expanded by the YAML reader itself (an alias is the anchored node): the bound
    # must hold there, before the normalizer copies anything.
    with pytest.raises(NormalizeError, match=f"over {MAX_YAML_NODES} YAML nodes"):
        load_yaml(laughs() + BOMBS["command"], "laughs.yaml")
    # aliases of a small anchor many times over are fine, as in real files
    doc = "x-c: &c {restart: always, image: a:1}\nservices:\n" + "".join(
        f"  s{i}:\n    <<: *c\n" for i in range(200))
    assert len(load_yaml(doc)["services"]) == 200
    # a document just over the bound is refused whether its nodes are aliased or not
    flat = "a: [" + ",".join(["1"] * MAX_YAML_NODES) + "]\n"
    with pytest.raises(NormalizeError, match="YAML nodes"):
        load_yaml(flat)


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(NormalizeError, match="inside its own anchor"):
        load_yaml("services:\n  web: &w\n    image: a:1\n    x: *w\n", "r.yaml")


# --- depth ----------------------------------------------------------------------------------

def test_a_3000_deep_mapping_is_exit_2_nested_too_deep(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("services:\n  web:\n    labels:\n" + "".join(
        "  " * (depth + 3) + f"k{depth}:\n" for depth in range(3000)))
    result = cpctl("check", str(path))
    assert result.returncode == 2, result.stderr[:2000]
    line = one_line(result.stderr)
    assert line.startswith(f"cpctl compose: {path}:") and "nested too deep" in line


def test_depth_is_bounded_through_aliases_too() -> None:
    chain = "x-0: &d0 [1]\n" + "".join(f"x-{i}: &d{i} [*d{i - 1}]\n" for i in range(1, 70))
    with pytest.raises(NormalizeError, match="nested too deep"):
        load_yaml(chain)
    # at the bound itself a document is read
    nested = "a: " + "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1) + "\n"
    assert load_yaml(nested) is not None


def test_variable_defaults_nested_500_deep_are_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "defaults.yaml"
    value = "${A:-" * 500 + "x" + "}" * 500
    path.write_text(f"services:\n  web:\n    image: '{value}'\n")
    result = cpctl("check", str(path))
    assert result.returncode == 2, result.stderr[:2000]
    line = one_line(result.stderr)
    assert f"{path}: /services/web/image: variable defaults nested over" in line
    # the same in a .env file
    (tmp_path / ".env").write_text(f"A={value}\n")
    (tmp_path / "plain.yaml").write_text("services:\n  web:\n    image: nginx:1.25\n")
    result = cpctl("check", str(tmp_path / "plain.yaml"))
    assert result.returncode == 2, result.stderr[:2000]
    assert "variable defaults nested over" in one_line(result.stderr)


def test_variables_that_multiply_are_refused(tmp_path: Path) -> None:
    # A .env file where each line is ten of the line before: ten characters, a gigabyte nine
    # lines later; and a compose file that refers to one large variable many times.
    lines = ["A0=xxxxxxxxxx"] + [f"A{i}=" + f"${{A{i - 1}}}" * 10 for i in range(1, 10)]
    (tmp_path / ".env").write_text("\n".join(lines) + "\n")
    path = tmp_path / "compose.yaml"
    path.write_text("services:\n  web:\n    image: nginx:1.25\n")
    result = cpctl("check", str(path))
    assert result.returncode == 2, result.stderr[:2000]
    line = one_line(result.stderr)
    assert f"{tmp_path / '.env'}: A5: variables expand to over {MAX_INTERPOLATED_CHARS}" in line
    (tmp_path / ".env").write_text("BIG=" + "x" * 10_000 + "\n")
    path.write_text("services:\n  web:\n    image: nginx:1.25\n    labels:\n" + "".join(
        f"      l{i}: ${{BIG}}\n" for i in range(100)))
    result = cpctl("check", str(path))
    assert result.returncode == 2, result.stderr[:2000]
    assert f"{path}: /services/web/labels/l" in one_line(result.stderr)


# --- bytes that are not UTF-8 ----------------------------------------------------------------

def test_a_byte_that_is_not_utf8_is_exit_2_naming_file_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    head = b"services:\n  web:\n    image: caf"
    path.write_bytes(head + b"\xe9:1\n")
    result = cpctl("check", str(path))
    assert result.returncode == 2, result.stderr[:2000]
    line = one_line(result.stderr)
    assert str(path) in line and f"byte 0xe9 at offset {len(head)}" in line
    env_file = tmp_path / "vars.env"
    env_file.write_bytes(b"A=\xff\n")
    (tmp_path / "ok.yaml").write_text("services:\n  web:\n    image: nginx:1.25\n")
    result = cpctl("normalize", str(tmp_path / "ok.yaml"), "--env-file", str(env_file))
    assert result.returncode == 2, result.stderr[:2000]
    line = one_line(result.stderr)
    assert str(env_file) in line and "byte 0xff at offset 2" in line


def test_a_shell_variable_that_is_not_utf8_is_exit_2_not_26_error_cells(tmp_path: Path) -> None:
    path = tmp_path / "tag.yaml"
    path.write_text("services:\n  web:\n    image: nginx:${TAG}\n")
    result = subprocess.run([sys.executable, "-m", "service", "compose", "check", str(path),
                             "--strict"],
                            cwd=REPO, env={**os.environ, "TAG": "1.25"}, capture_output=True,
                            text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert result.returncode == 1, result.stderr  # (no healthcheck etc.: warnings, --strict)
    result = subprocess.run([sys.executable, "-m", "service", "compose", "check", str(path)],
                            cwd=REPO, env={**os.environb, b"TAG": b"\xff"},
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert result.returncode == 2, result.stdout[:2000]
    assert "invalid_string: /fields/services/web/image:" in one_line(result.stderr)


# --- the contract -----------------------------------------------------------------------------

def test_help_documents_the_exit_codes() -> None:
    result = cpctl("check", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for code in ("0 passed", "1 not passed", "2 unusable input", "3 internal error"):
        assert code in text
    assert "CONTROLPLANE_DEBUG" in text and "--debug" in text


def test_an_internal_error_is_exit_3_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise KeyError("a bug")

    monkeypatch.setattr(compose_cli, "evaluate", broken)
    good = str(REPO / "examples" / "compose" / "good.compose.yaml")
    out, err = io.StringIO(), io.StringIO()
    assert compose_cli.run(["check", good], stdout=out, stderr=err, environ={}) == 3
    line = one_line(err.getvalue())
    assert "internal error (KeyError)" in line and "--debug" in line and out.getvalue() == ""
    for argv, environ in ((["check", good, "--debug"], {}),
                          (["check", good], {"CONTROLPLANE_DEBUG": "1"})):
        err = io.StringIO()
        assert compose_cli.run(argv, stdout=io.StringIO(), stderr=err, environ=environ) == 3
        assert "Traceback" in err.getvalue() and "KeyError: 'a bug'" in err.getvalue()
        assert err.getvalue().splitlines()[-1].startswith("cpctl compose: internal error")


def test_a_policy_directory_without_rules_is_exit_2_not_passed(tmp_path: Path) -> None:
    good = str(REPO / "examples" / "compose" / "good.compose.yaml")
    result = cpctl("check", good, "--policies", str(tmp_path))
    assert result.returncode == 2, result.stdout[:2000]
    assert "no compose rules" in one_line(result.stderr)


# --- JUnit and control characters ----------------------------------------------------------

CONTROL_IMAGE = "bad\x01im\x1b[31mage\x7f:latest"


def test_junit_is_xml_when_a_value_holds_control_characters(tmp_path: Path) -> None:
    path = tmp_path / "ctl\x02.yaml"  # the file names are an attribute of <testsuites>
    path.write_text('services:\n  web:\n    image: "bad\\x01im\\e[31mage\\x7f:latest"\n'
                    "    privileged: true\n", encoding="utf-8")
    result = cpctl("check", str(path), "--format", "junit")
    assert result.returncode == 1, result.stderr[:2000]
    root = ET.fromstring(result.stdout.split("\n", 1)[1])  # noqa: S314 - our own output
    assert root.get("name", "").endswith("ctl\\x02.yaml")
    (suite,) = root.iter("testsuite")
    pinning = [c for c in suite.iter("testcase") if c.get("name") == "image-pinning"]
    out = pinning[0].find("system-out")
    assert out is not None and out.text is not None
    assert "image bad\\x01im\\x1b[31mage\x7f:latest uses the mutable :latest tag" in out.text
    # and the table does not hand the terminal an escape sequence
    table = cpctl("check", str(path))
    assert "\x1b" not in table.stdout and "\x01" not in table.stdout
    assert "image bad\\x01im\\x1b[31mage\\x7f:latest uses" in table.stdout


# --- quotes and backslashes are data -------------------------------------------------------

IMAGES = ['ngi"nx:latest', "reg\\istry/app:latest", 'a\\"b', "x\\", '"quoted"',
          "C:\\new\\tag", 'x", "severity": "info', "tecnativa/docker-socket-proxy\"\\:1",
          CONTROL_IMAGE]


def hostile_fields(image: str) -> dict[str, Any]:
    return {"services": {"web": {
        "image": image,
        "volumes": [{"type": "bind", "source": "/var/run/docker.sock",
                     "target": "/var/run/docker.sock"},
                    {"type": "bind", "source": f"/home/{image}", "target": "/data"}],
    }}}


def assert_no_error_cell_and_exact_messages(report: dict[str, Any], image: str) -> None:
    errors = [(c["rule"], c["message"]) for c in report["matrix"] if c["result"] == "error"]
    assert errors == []
    messages = [f["message"] for f in report["findings"] if f["rule"] == "image-pinning"]
    assert any(f"image {image} " in m for m in messages), messages
    mounts = [f["message"] for f in report["findings"] if f["rule"] == "sensitive-mounts"]
    assert any("/var/run/docker.sock" in m for m in mounts), mounts


@pytest.mark.parametrize("image", IMAGES)
def test_quotes_and_backslashes_in_an_image_are_data(rules: RuleSet, image: str) -> None:
    report = evaluate(hostile_fields(image), rules=rules, env="prod", cache=False)
    assert_no_error_cell_and_exact_messages(report, image)


@pytest.mark.parametrize("option", ['a"b\\c', "C:\\profiles\\x", "x\\"])
def test_a_security_opt_with_a_backslash_is_data(rules: RuleSet, option: str) -> None:
    # regopy's trim_space fails on a stray backslash: the two rules that trim options must not.
    report = evaluate({"services": {"web": {"image": "a:1", "security_opt": [
        option, "seccomp:unconfined", " no-new-privileges:true "]}}}, rules=rules, cache=False)
    cells = {c["rule"]: c["result"] for c in report["matrix"]}
    assert (cells["security-opt"], cells["no-new-privileges"]) == ("fail", "pass")
    assert [f["message"] for f in report["findings"] if f["rule"] == "security-opt"] == [
        "security_opt seccomp:unconfined disables confinement"]


@pytest.mark.parametrize("value", ['a"b\\c', "C:\\secrets\\x", "x\\", ' "pa\\ss" '])
def test_an_environment_value_with_a_backslash_is_data(rules: RuleSet, value: str) -> None:
    # secret-env trims values before comparing them: a stray backslash must not fail the rule.
    report = evaluate({"services": {"web": {"image": "a:1", "environment": {
        "DB_PASSWORD": value, "FOO": value}}}}, rules=rules, cache=False)
    cells = {c["rule"]: c["result"] for c in report["matrix"]}
    assert cells["secret-env"] == "fail"
    assert [f["message"] for f in report["findings"] if f["rule"] == "secret-env"] == [
        "environment DB_PASSWORD holds a literal secret value"]


def test_the_cli_reports_a_quoted_image_without_an_error_cell(tmp_path: Path) -> None:
    path = tmp_path / "quote.yaml"
    path.write_text('services:\n  web:\n    image: "ngi\\"nx\\\\x:latest"\n    volumes:\n'
                    "      - /var/run/docker.sock:/var/run/docker.sock\n")
    result = cpctl("check", str(path), "--format", "json")
    assert result.returncode == 1, result.stderr[:2000]
    assert_no_error_cell_and_exact_messages(json.loads(result.stdout), 'ngi"nx\\x:latest')


@pytest.mark.parametrize("image", IMAGES[:3])
async def test_the_endpoint_reports_a_quoted_image_without_an_error_cell(
    client: Any, image: str
) -> None:
    token = await login(client, "carol")
    response = await client.post("/api/v1/compose/import", headers=bearer(token),
                                 json={"fields": hostile_fields(image), "env": "prod"})
    assert response.status == 200
    assert_no_error_cell_and_exact_messages(await response.json(), image)


async def test_the_endpoint_refuses_deep_nesting_with_a_problem(client: Any) -> None:
    token = await login(client, "carol")
    deep = '{"k":' * 3000 + "{}" + "}" * 3000
    body = '{"fields": {"services": {"web": {"labels": ' + deep + "}}}}"
    response = await client.post("/api/v1/compose/import", data=body,
                                 headers={**bearer(token), "Content-Type": "application/json"})
    problem = await response.json()
    assert (response.status, problem["code"]) == (422, "too_deep"), problem
    assert response.content_type == "application/problem+json"
    assert "Traceback" not in json.dumps(problem)


STRINGS = ['a"b', "a\\b", "a\x01b", "a\nb", '"x"', '"', '""', "\\", 'x", "k": "y', "C:\\temp",
           "a\\nb", "\x1b[31m", "é", "\u2028", "plain"]


def test_a_policy_result_carries_any_input_string_exactly() -> None:
    bundle = compile_bundle([Module("t.rego", """package t
import rego.v1
r := {"same": input.s, "msg": sprintf("got %v here", [input.s]),
      "joined": concat("", ["<", input.s, ">"]), "list": [input.s], "keyed": {input.s: 1},
      "n": count(input.s), "lit": "plain literal"}
""")], {}, ["t/r"])
    for text in STRINGS:
        result = bundle.query("t/r", {"s": text})
        quoted = len(text) >= 2 and text[0] == text[-1] == '"'
        if quoted:  # given to the engine in one more pair of quotes, which sprintf copies
            assert result.pop("msg") == f'got "{text}" here'
        assert result == {
            "same": text, "joined": f"<{text}>", "list": [text], "keyed": {text: 1},
            "n": len(text), "lit": "plain literal",
            **({} if quoted else {"msg": f"got {text} here"})}, repr(text)
