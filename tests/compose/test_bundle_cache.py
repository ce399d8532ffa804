"""The compiled-bundle cache (``service.rego.compile_bundle(..., cache=...)``) that
``cpctl compose check`` keeps: a second process loads what the first compiled, and only a
bundle that passes every check is ever loaded (the checks are shown by planting, under the
right name, a bundle compiled from other rules: it answers only when it would be trusted)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from service import rego
from service.cli.compose import run
from service.compose.preflight import POLICY_DIR
from tests.compose.support import EXAMPLES

ENTRY = ["cache/answer"]


def module(answer: str) -> list[rego.Module]:
    return [rego.Module("cache.rego", f'package cache\n\nanswer := "{answer}"\n')]


def plant_foreign(cache: Path) -> Path:
    """Compile ``answer := "foreign"`` and move it, with its digest, to the name of the
    ``answer := "real"`` bundle: a cache hit is then told by its answer."""
    other = cache.parent / "other"
    rego.compile_bundle(module("foreign"), {}, ENTRY, cache=other)
    real = rego.compile_bundle(module("real"), {}, ENTRY, cache=cache)
    assert real.query(ENTRY[0], {}) == "real"
    (rbb,) = cache.glob("*.rbb")
    (foreign,) = other.glob("*.rbb")
    shutil.copyfile(foreign, rbb)
    shutil.copyfile(foreign.with_suffix(".sha256"), rbb.with_suffix(".sha256"))
    return rbb


def answer(cache: Path) -> str:
    result = rego.compile_bundle(module("real"), {}, ENTRY, cache=cache).query(ENTRY[0], {})
    assert isinstance(result, str)
    return result


def test_a_saved_bundle_is_loaded(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    plant_foreign(cache)
    assert answer(cache) == "foreign"  # loaded, not compiled
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert all(oct(f.stat().st_mode & 0o777) == "0o600" for f in cache.iterdir())


def test_other_sources_do_not_find_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    plant_foreign(cache)
    other = rego.compile_bundle(module("real"), {"x": 1}, ENTRY, cache=cache)  # other data
    assert other.query(ENTRY[0], {}) == "real"


def test_bytes_that_do_not_match_the_digest_are_compiled_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    rbb = plant_foreign(cache)
    rbb.write_bytes(rbb.read_bytes()[:-10])  # torn write
    assert answer(cache) == "real"
    assert answer(cache) == "real"  # and the compiled bundle was saved in its place


@pytest.mark.parametrize("where", ["directory", "file"])
def test_a_bundle_others_could_write_is_not_loaded(tmp_path: Path, where: str) -> None:
    cache = tmp_path / "cache"
    rbb = plant_foreign(cache)
    (cache if where == "directory" else rbb).chmod(0o777 if where == "directory" else 0o666)
    assert answer(cache) == "real"


def test_a_link_is_not_loaded(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    rbb = plant_foreign(cache)
    target = tmp_path / "elsewhere.rbb"
    rbb.rename(target)
    rbb.symlink_to(target)
    assert answer(cache) == "real"


def test_only_the_newest_bundles_are_kept(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for i in range(rego.CACHE_KEEP + 3):
        rego.compile_bundle(module(f"v{i}"), {}, ENTRY, cache=cache)
    assert len(list(cache.glob("*.rbb"))) == len(list(cache.glob("*.sha256"))) == rego.CACHE_KEEP
    assert answer(cache) == "real"


def test_cpctl_compose_check_keeps_its_rules_cached(tmp_path: Path) -> None:
    """Same report compiled, saved, and loaded (each policy copy is a path of its own, so this
    process's own rule-set cache does not answer)."""
    environ = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    bundles = tmp_path / "xdg" / "controlplane" / "bundles"

    def check(name: str, env: dict[str, str]) -> tuple[int, str]:
        policies = tmp_path / name
        shutil.copytree(POLICY_DIR, policies)
        out = io.StringIO()
        code = run(["check", str(EXAMPLES / "risky.compose.yaml"), "--env", "prod", "--format",
                    "sarif", "--policies", str(policies)],
                   stdout=out, stderr=io.StringIO(), environ=env)
        return code, out.getvalue()

    compiled = check("a", {**environ, "CONTROLPLANE_BUNDLE_CACHE": "0"})
    assert not bundles.exists()
    saved = check("b", environ)
    assert len(list(bundles.glob("*.rbb"))) == 1
    loaded = check("c", environ)
    assert compiled == saved == loaded
    assert compiled[0] == 1 and json.loads(compiled[1])["runs"][0]["results"]
