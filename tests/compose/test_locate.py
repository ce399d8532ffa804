"""Findings carry the real line and column of the key they are about, in the file that sets it
(SARIF regions, the table's findings), also across merged files, anchors and list syntax."""

from __future__ import annotations

import io
import json
from pathlib import Path

from service.cli import compose as compose_cli
from service.compose.locate import Location, Locator
from tests.compose.support import EXAMPLES

BASE = """\
x-common: &common
  read_only: true
  security_opt: ["no-new-privileges:true"]
services:
  web:
    <<: *common
    image: nginx:latest
    environment:
      - LOG_LEVEL=info
      - DB_PASSWORD=hunter2hunter2
    ports:
      - "127.0.0.1:8080:80"
  db:
    image: postgres:16
    volumes:
      - type: bind
        source: /etc/ssh
        target: /keys
volumes:
  keys:
    driver_opts: {type: none, o: bind, device: /etc}
"""

OVERRIDE = """\
services:
  web:
    read_only: false
    ports:
      - "9229:9229"
"""


def files(tmp_path: Path) -> list[str]:
    (tmp_path / "compose.yaml").write_text(BASE)
    (tmp_path / "compose.override.yaml").write_text(OVERRIDE)
    return [str(tmp_path / "compose.yaml"), str(tmp_path / "compose.override.yaml")]


def test_locations_in_one_file(tmp_path: Path) -> None:
    base, _ = files(tmp_path)
    locator = Locator([base])
    assert locator.find("/services/web/image") == Location(base, 7, 5)
    assert locator.find("/services/web/environment/DB_PASSWORD") == Location(base, 10, 9)
    assert locator.find("/services/web/ports/0") == Location(base, 12, 9)
    assert locator.find("/services/web/ports/0/target") == Location(base, 12, 9)
    # Through the << merge key: the anchored text, where the setting is written.
    assert locator.find("/services/web/security_opt") == Location(base, 3, 3)
    # Long syntax: the key inside the entry.
    assert locator.find("/services/db/volumes/0/source") == Location(base, 17, 9)
    # A missing setting: the service.
    assert locator.find("/services/db/deploy/resources/limits/memory") == Location(base, 13, 3)
    assert locator.find("/volumes/keys/driver_opts/device") == Location(base, 21, 40)
    assert locator.find("/services/nope") == Location(base, 4, 1)
    assert Locator([str(tmp_path / "missing.yaml")]).find("/services/web") is None


def test_locations_across_merged_files(tmp_path: Path) -> None:
    base, override = files(tmp_path)
    locator = Locator([base, override])
    assert locator.find("/services/web/read_only") == Location(override, 3, 5)  # overridden
    assert locator.find("/services/web/image") == Location(base, 7, 5)  # only in the base
    # ports are a union: entry 0 is the base's, entry 1 the override's.
    assert locator.find("/services/web/ports/0") == Location(base, 12, 9)
    assert locator.find("/services/web/ports/1") == Location(override, 5, 9)
    # Missing everywhere: where the service is defined, not where an override touches it.
    assert locator.find("/services/web/user") == Location(base, 5, 3)


def test_sarif_results_carry_the_real_lines(tmp_path: Path) -> None:
    base, override = files(tmp_path)
    out = io.StringIO()
    code = compose_cli.run(["check", base, override, "--format", "sarif", "--env-file",
                            "/dev/null"], stdout=out, stderr=io.StringIO(), environ={})
    assert code == 1
    results = json.loads(out.getvalue())["runs"][0]["results"]

    def region(rule: str, pointer: str) -> tuple[str, int, int]:
        (hit,) = [r for r in results if r["ruleId"] == rule
                  and r["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] == pointer]
        physical = hit["locations"][0]["physicalLocation"]
        location = physical["artifactLocation"]  # the tmp files are outside the working dir
        assert "uriBaseId" not in location and location["uri"].startswith("file:///")
        return (location["uri"].removeprefix("file://"), physical["region"]["startLine"],
                physical["region"]["startColumn"])

    assert region("image-pinning", "/services/web/image") == (base, 7, 5)
    assert region("secret-env", "/services/web/environment/DB_PASSWORD") == (base, 10, 9)
    assert region("read-only-rootfs", "/services/web/read_only") == (override, 3, 5)
    assert region("published-ports", "/services/web/ports/1") == (override, 5, 9)
    assert region("sensitive-mounts", "/services/db/volumes/0/source") == (base, 17, 9)
    assert all(r["locations"][0]["physicalLocation"]["region"]["startLine"] > 1
               for r in results)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_table_colour_on_a_tty_unless_no_color() -> None:
    risky = str(EXAMPLES / "risky.compose.yaml")
    coloured = _Tty()
    compose_cli.run(["check", risky], stdout=coloured, stderr=io.StringIO(), environ={})
    assert "\x1b[1;31mFAIL" in coloured.getvalue()
    plain = _Tty()
    compose_cli.run(["check", risky], stdout=plain, stderr=io.StringIO(),
                    environ={"NO_COLOR": "1"})
    piped = io.StringIO()
    compose_cli.run(["check", risky], stdout=piped, stderr=io.StringIO(), environ={})
    assert "\x1b[" not in plain.getvalue() and "\x1b[" not in piped.getvalue()
    assert plain.getvalue() == piped.getvalue()
    # Readable columns: rule ids down, service names across, findings at file:line:column.
    lines = piped.getvalue().splitlines()
    assert lines[0].split() == ["rule", "agent", "web"]
    assert any(line.split()[:3] == ["privileged", "FAIL", "ok"] for line in lines)
    assert f"({risky}:5:5)" in piped.getvalue()  # privileged: true
