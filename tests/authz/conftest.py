"""Shared fixtures: the shipped policy engine and a factory for throwaway policy directories."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.authz.engine import PolicyEngine, default_policies_dir

REPO = Path(__file__).resolve().parents[2]
ENVIRONMENTS = "environments:\n  dev: {production: false}\n  prod: {production: true}\n"


@pytest.fixture(scope="module")
def shipped() -> PolicyEngine:
    engine = PolicyEngine(default_policies_dir())
    assert engine.load().ok
    return engine


def write_policy(
    root: Path,
    rego: str,
    *,
    tests: str | None = None,
    data: str = ENVIRONMENTS,
    bindings: str = "bindings:\n  alice: {roles: [op]}\nroles:\n  op:\n    grants:\n"
    "      - {actions: ['*'], envs: ['*']}\n",
) -> Path:
    """A policies dir with one module (``authz.rego``), optional tests and small data."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "authz.rego").write_text(textwrap.dedent(rego))
    test_file = root / "authz_test.rego"
    if tests is not None:
        test_file.write_text(textwrap.dedent(tests))
    elif test_file.exists():
        test_file.unlink()
    (root / "data").mkdir(exist_ok=True)
    (root / "data" / "env.yaml").write_text(data)
    (root / "data" / "rbac.yaml").write_text(bindings)
    return root


def candidate_without_carols_role(root: Path) -> Path:
    """The shipped policies with one role binding revoked: carol loses `viewer`."""
    shutil.copytree(REPO / "policies", root, ignore=shutil.ignore_patterns("compose"))
    bindings = root / "data" / "bindings.yaml"
    text = bindings.read_text()
    assert "  carol: {roles: [viewer]}\n" in text
    bindings.write_text(text.replace("  carol: {roles: [viewer]}\n", "  carol: {roles: []}\n"))
    return root


@pytest.fixture
def policy_dir(tmp_path: Path) -> Callable[..., Path]:
    def make(rego: str, **kw: Any) -> Path:
        return write_policy(tmp_path / "policies", rego, **kw)

    return make


def doc(
    subject: str = "alice",
    kind: str = "human",
    action: str = "installer.run.execute",
    env: str = "dev",
    **extra: Any,
) -> dict[str, Any]:
    """An input document as the chain builds it."""
    out: dict[str, Any] = {
        "principal": {
            "subject_id": subject,
            "kind": kind,
            "session_id": "s1",
            "auth_time": 1.0,
            "authn_method": "password",
            "step_up": {"verified": True, "at": 2.0, "age_s": 3},
        },
        "action": action,
        "resource": {"id": "r1", "kind": "installer-run", "hash": "sha256:" + "0" * 64},
        "env": env,
        "context": {
            "correlation_id": "corr-1",
            "method": "POST",
            "path": "/api/v1/x",
            "command_hash": None,
            "time": "2026-01-01T00:00:00Z",
        },
    }
    out.update(extra)
    return out
