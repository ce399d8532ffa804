"""The package's shape, pinned: no import cycle, and the chain hands each Execute step what its
action needs (a transaction exactly for mutating actions)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from service.api import routes as api_routes
from service.chain import Run, Write

SERVICE = Path(__file__).resolve().parent.parent / "service"


def _module_graph() -> dict[str, set[str]]:
    """Module -> the service modules it imports, at import time or for type checking only
    (``if TYPE_CHECKING:``): a type-only cycle is a cycle of the design all the same, one
    refactoring away from a real one. Imports inside functions do not count (they run after
    every module is loaded, so they cannot make an import cycle)."""
    modules = {}
    for path in SERVICE.rglob("*.py"):
        parts = path.relative_to(SERVICE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _module_level(tree.body):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # ``from . import sibling`` imports the sibling module; the package itself
                # only when a name is not a module (a parent is loaded before its child anyway).
                submodules = [f"{target}.{alias.name}" for alias in node.names]
                candidates = [c for c in submodules if c in modules]
                if len(candidates) < len(submodules):
                    candidates.append(target)
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            graph[name].update(c for c in candidates if c in modules and c != name)
    return graph


def _module_level(body: list[ast.stmt]) -> typing.Iterator[ast.stmt]:
    """The statements a module runs when loaded, with those under ``if`` (TYPE_CHECKING
    included) and ``try``; not the bodies of functions and classes."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *(h.body for h in node.handlers)):
                yield from _module_level(block)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle() -> None:
    graph = _module_graph()
    assert graph.get("service.chain"), "the graph reader found nothing"
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    source = "if TYPE_CHECKING:\n    from .typed import T\ndef f():\n    from .late import g\n"
    found = [n.module for n in _module_level(ast.parse(source).body)
             if isinstance(n, ast.ImportFrom)]
    assert found == ["typed"], "type-only imports count, imports inside functions do not"


def _protected_routes() -> list[pytest.param]:
    found = []
    for module in api_routes._MODULES:
        for route in module.routes:
            handler = getattr(route, "handler", None)
            if getattr(handler, "protection", None) is not None:
                found.append(pytest.param(handler, id=f"{route.method} {route.path}"))
    return found


@pytest.mark.parametrize("handler", _protected_routes())
def test_execute_steps_of_mutating_actions_take_a_write(handler: typing.Any) -> None:
    """A mutating action's Execute step is typed to receive a ``Write`` (its transaction), a
    read's a ``Run``; the chain builds a ``Write`` exactly for mutating actions (and for reads
    that redeem a ticket, which a ``Run`` parameter accepts)."""
    hints = typing.get_type_hints(handler.execute)
    param = next(v for k, v in hints.items() if k != "return")
    want = Write if handler.protection.action.mutating else Run
    assert param is want


#: Where the process environment may be read: the configuration's door, the supervisor (which
#: sets prometheus-client's own variable for its workers), the CLI's client settings, and compose
#: interpolation (which is defined over the shell environment).
ENVIRON_READERS = {"config.py", "cli/serve.py", "cli/client.py", "cli/compose.py"}


def test_only_the_edges_read_the_environment() -> None:
    readers = {
        str(path.relative_to(SERVICE))
        for path in SERVICE.rglob("*.py")
        if any(word in path.read_text(encoding="utf-8") for word in ("os.environ", "getenv("))
    }
    assert "config.py" in readers, "the scan found nothing"
    assert readers <= ENVIRON_READERS, sorted(readers - ENVIRON_READERS)


def test_every_e2e_entry_names_an_existing_test() -> None:
    # A renamed or moved test named in E2E_TESTS would silently fall back into ``make test``.
    from tests.conftest import E2E_TESTS, REPO

    for entry in sorted(E2E_TESTS):
        path, _, name = entry.partition("::")
        source = (REPO / path).read_text()
        assert not name or f"def {name}(" in source, f"{entry}: no such test"
