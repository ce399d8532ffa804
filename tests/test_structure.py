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


def _modules() -> dict[str, Path]:
    """Every module of the service package: dotted name -> file."""
    found = {}
    for path in SERVICE.rglob("*.py"):
        parts = path.relative_to(SERVICE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _source(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` in module ``name`` (file ``path``) imports from, with a
    relative import resolved against its package."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _module_graph() -> dict[str, set[str]]:
    """Module -> the service modules it imports, at import time or for type checking only
    (``if TYPE_CHECKING:``): a type-only cycle is a cycle of the design all the same, one
    refactoring away from a real one. Imports inside functions do not count (they run after
    every module is loaded, so they cannot make an import cycle)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _module_level(tree.body):
            if isinstance(node, ast.ImportFrom):
                target = _source(name, path, node)
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


# -- layers: adapters stand apart, and a module's private names stay its own ---------------------

#: The adapters: each turns the core (chain, stages, store) into one surface. None may use
#: another, so one can change or go without touching the others.
ADAPTERS = ("service.api", "service.console", "service.cli")


def _imports(name: str, path: Path) -> list[tuple[ast.stmt, str, list[str]]]:
    """Every import statement of a module, wherever it is (module level, inside functions,
    under ``TYPE_CHECKING``): ``(node, module imported from, names)``; for ``import a.b`` the
    module is ``a.b`` and the names are empty."""
    found: list[tuple[ast.stmt, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            found.append((node, _source(name, path, node), [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((node, alias.name, []) for alias in node.names)
    return found


def _adapter(module: str) -> str | None:
    return next((a for a in ADAPTERS if module == a or module.startswith(a + ".")), None)


def _adapter_crossings(modules: dict[str, Path]) -> list[str]:
    crossings = []
    for name, path in sorted(modules.items()):
        own = _adapter(name)
        if own is None:
            continue
        for node, source, names in _imports(name, path):
            for target in [source, *(f"{source}.{n}" for n in names)]:
                other = _adapter(target)
                if other is not None and other != own:
                    crossings.append(f"{name}:{node.lineno} imports {target}")
                    break
    return crossings


def test_adapters_do_not_import_each_other() -> None:
    """``service.api``, ``service.console`` and ``service.cli`` import none of the others, at
    import time or inside a function: what two of them share lives in the core (the review
    step in ``approvals.review``, the console cookie in ``consolesession``, the start of a
    sign-in in ``signin``). The console's sign-ins land through the API's one callback by the
    app's ``CONSOLE_LANDING``, not by an import."""
    modules = _modules()
    assert any(_adapter(m) == "service.console" for m in modules), "the scan found nothing"
    assert _adapter_crossings(modules) == []


def test_the_adapter_check_sees_function_level_imports(tmp_path: Path) -> None:
    console = tmp_path / "service" / "console"
    console.mkdir(parents=True)
    (console / "views.py").write_text("def f():\n    from ..api import approvals\n")
    (console / "pages.py").write_text("from service.cli.main import main\n")
    (console / "html.py").write_text("from ..approvals import review\n")
    modules = {f"service.console.{p.stem}": p for p in console.glob("*.py")}
    assert sorted(_adapter_crossings(modules)) == [
        "service.console.pages:1 imports service.cli.main",
        "service.console.views:2 imports service.api",
    ]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(modules: dict[str, Path]) -> list[str]:
    """``from M import _x`` and ``M._x`` where ``M`` is another module of the service."""
    uses = []
    for name, path in sorted(modules.items()):
        bound: dict[str, str] = {}  # a local name -> the service module it is bound to
        for node, source, _ in _imports(name, path):
            assert isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names:
                if isinstance(node, ast.Import):  # ``import service.x as y``: y is bound to it
                    if alias.name in modules and alias.asname:
                        bound[alias.asname] = alias.name
                    continue
                if source in modules and _private(alias.name):
                    uses.append(f"{name}:{node.lineno} imports {source}.{alias.name}")
                if f"{source}.{alias.name}" in modules:  # ``from . import x``: x is a module
                    bound[alias.asname or alias.name] = f"{source}.{alias.name}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and _private(node.attr)
                    and isinstance(node.value, ast.Name) and node.value.id in bound
                    and bound[node.value.id] != name):
                uses.append(f"{name}:{node.lineno} uses {bound[node.value.id]}.{node.attr}")
    return uses


def test_no_module_uses_another_modules_private_names() -> None:
    """A leading underscore means "this module's own": no module of the service imports
    another's private name or reaches it as ``module._name``, within a package or across
    packages alike (a name two modules need is public, with a docstring, in the module that
    owns it). Private attributes of objects (``self._x``, ``ring._reload`` inside the class's
    own module) and of other libraries' modules are not this test's business; tests are exempt
    (they may look inside what they test)."""
    modules = _modules()
    assert _private_uses(modules) == []


def test_the_private_name_check_finds_both_forms(tmp_path: Path) -> None:
    package = tmp_path / "service" / "api"
    package.mkdir(parents=True)
    (package / "authn.py").write_text("def _caller(): ...\n")
    (package / "federation.py").write_text(
        "from .authn import _caller\nfrom . import authn\n\ndef f():\n    return authn._caller\n")
    modules = {f"service.api.{p.stem}": p for p in package.glob("*.py")}
    assert _private_uses(modules) == [
        "service.api.federation:1 imports service.api.authn._caller",
        "service.api.federation:5 uses service.api.authn._caller",
    ]
