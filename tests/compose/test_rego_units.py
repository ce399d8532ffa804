"""The Rego unit tests of the compose rules (``policies/compose/*_test.rego``): every ``test_*``
rule of those modules must evaluate to true. They call the rules' helper functions directly
(no ``with input as``, which crashes regopy 1.5)."""

from __future__ import annotations

import re

import pytest

from service.compose.preflight import POLICY_DIR
from service.rego import Bundle, Module, compile_bundle

_PACKAGE = re.compile(r"^package\s+([\w.]+)", re.M)
_TEST = re.compile(r"^(test_\w+)\s+if\b", re.M)

TEST_FILES = sorted(POLICY_DIR.glob("*_test.rego"))
CASES = [(path.name, "/".join([*_PACKAGE.findall(path.read_text())[0].split("."), name]))
         for path in TEST_FILES for name in dict.fromkeys(_TEST.findall(path.read_text()))]


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    modules = [Module(path.name, path.read_text(encoding="utf-8"))
               for path in sorted(POLICY_DIR.glob("*.rego"))]
    return compile_bundle(modules, {}, [entrypoint for _, entrypoint in CASES])


def test_every_new_style_rule_has_rego_tests() -> None:
    tested = {path.name.removesuffix("_test.rego") for path in TEST_FILES}
    assert tested >= {"no_new_privileges", "host_userns", "bind_propagation", "pids_limit",
                      "cgroup", "privileged_ports", "security_opt_missing",
                      "restart_max_attempts", "default_network", "sensitive_mounts",
                      "secret_env", "image_pinning"}
    assert len(CASES) >= 25


@pytest.mark.parametrize(("file", "entrypoint"), CASES, ids=[e for _, e in CASES])
def test_rego_unit(bundle: Bundle, file: str, entrypoint: str) -> None:
    assert bundle.query(entrypoint, {}) is True, f"{file}: {entrypoint}"
