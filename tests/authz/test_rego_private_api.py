"""Every private regopy name service/rego.py relies on, with the ctypes signature it assumes.

service/rego.py calls regopy's ctypes bindings of the native library directly (``rego_shared``,
the ``rego*`` functions, the ``_impl`` handles): none of it is regopy's public API, and ctypes
checks nothing a release might change, so a changed signature would be undefined behaviour at run
time. These tests turn such a regopy upgrade into a CI failure. pyproject.toml pins regopy to the
minor version below; moving the pin means reviewing this file against the new release.

The table is checked against service/rego.py's source too: a new private name used there without
an entry here fails ``test_the_table_covers_every_private_name_rego_py_uses``.
"""

from __future__ import annotations

import ast
import ctypes
import importlib.metadata
import inspect
import tomllib
from pathlib import Path

import pytest
import regopy
from packaging.requirements import Requirement
from packaging.version import Version

from service import rego

REPO = Path(__file__).resolve().parents[2]

#: The regopy minor version these signatures were checked against (pyproject.toml pins it).
TESTED_MINOR = (1, 5)

#: Native functions called through ``regopy.rego_shared.rego``: (argtypes, restype).
NATIVE_SIGNATURES: dict[str, tuple[list[type], type | None]] = {
    "regoNewInput": ([], ctypes.c_void_p),
    "regoFreeInput": ([ctypes.c_void_p], None),
    "regoInputString": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_uint32),
    "regoInputInt": ([ctypes.c_void_p, ctypes.c_int64], ctypes.c_uint32),
    "regoInputFloat": ([ctypes.c_void_p, ctypes.c_double], ctypes.c_uint32),
    "regoInputBoolean": ([ctypes.c_void_p, ctypes.c_bool], ctypes.c_uint32),
    "regoInputNull": ([ctypes.c_void_p], ctypes.c_uint32),
    "regoInputObjectItem": ([ctypes.c_void_p], ctypes.c_uint32),
    "regoInputObject": ([ctypes.c_void_p, ctypes.c_uint32], ctypes.c_uint32),
    "regoInputArray": ([ctypes.c_void_p, ctypes.c_uint32], ctypes.c_uint32),
    "regoSetInput": ([ctypes.c_void_p, ctypes.c_void_p], ctypes.c_uint32),
    "regoBundleQueryEntrypoint": (
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p],
        ctypes.c_void_p,
    ),
    "regoOutputOk": ([ctypes.c_void_p], ctypes.c_bool),
    "regoFreeOutput": ([ctypes.c_void_p], None),
    # reading a result from the output's node tree (strings the JSON text cannot carry)
    "regoOutputNode": ([ctypes.c_void_p], ctypes.c_void_p),
    "regoOutputExpressionsAtIndex": ([ctypes.c_void_p, ctypes.c_uint32], ctypes.c_void_p),
    "regoNodeType": ([ctypes.c_void_p], ctypes.c_uint32),
    "regoNodeSize": ([ctypes.c_void_p], ctypes.c_uint32),
    "regoNodeGet": ([ctypes.c_void_p, ctypes.c_uint32], ctypes.c_void_p),
}

#: Python helpers of ``regopy.rego_shared`` called with a raw handle; each returns ``str``.
SHARED_HELPERS = {"rego_get_error": ("impl",), "rego_output_string": ("impl",),
                  "rego_node_value": ("impl",)}

#: The node kinds service/rego.py reads a result's node tree by (``regopy.rego_shared.NodeKind``).
NODE_KINDS = {"_TERM": "Term", "_SCALAR": "Scalar", "_ARRAY": "Array", "_SET": "Set",
              "_OBJECT": "Object", "_OBJECT_ITEM": "ObjectItem", "_INT": "Int", "_FLOAT": "Float",
              "_STRING": "String", "_TRUE": "True_", "_FALSE": "False_", "_NULL": "Null",
              "_UNDEFINED": "Undefined", "_RESULTS": "Results"}

#: Other ``regopy.rego_shared`` names: the loaded library itself.
SHARED_OTHER = {"rego"}

#: Public names of the ``regopy`` package rego.py uses (listed so the source scan is complete).
PUBLIC_NAMES = {"Interpreter", "RegoError", "rego_shared", "BundleFormat", "__version__"}

#: Private attributes read from regopy objects: the native handle of Interpreter and Bundle.
PRIVATE_ATTRIBUTES = {"_impl"}


def _source_uses() -> tuple[set[str], set[str], set[str], set[str]]:
    """(``_native.X``, ``regopy.rego_shared.X``, ``regopy.X``, ``<not self/cls>._x``) in rego.py."""
    tree = ast.parse(Path(rego.__file__).read_text())
    native, shared, package, private = set(), set(), set(), set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id == "_native":
            native.add(node.attr)
        elif isinstance(value, ast.Name) and value.id == "regopy":
            package.add(node.attr)
        elif (
            isinstance(value, ast.Attribute)
            and value.attr == "rego_shared"
            and isinstance(value.value, ast.Name)
            and value.value.id == "regopy"
        ):
            shared.add(node.attr)
        elif (
            node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(value, ast.Name) and value.id in {"self", "cls"})
        ):
            private.add(node.attr)
    return native, shared, package, private


def test_the_table_covers_every_private_name_rego_py_uses():
    native, shared, package, private = _source_uses()
    assert native <= set(NATIVE_SIGNATURES), "add their ctypes signatures to NATIVE_SIGNATURES"
    assert shared <= set(SHARED_HELPERS) | SHARED_OTHER
    assert package <= PUBLIC_NAMES
    assert private <= PRIVATE_ATTRIBUTES
    # and the scan does see them (a rename in rego.py must not make this test vacuous)
    assert {"regoSetInput", "regoInputString"} <= native
    assert {"rego", "rego_get_error", "rego_output_string"} <= shared
    assert "_impl" in private


def test_the_node_kinds_are_regopys():
    for name, kind in NODE_KINDS.items():
        assert getattr(rego, name) == regopy.rego_shared.NodeKind[kind].value, name


def test_rego_py_binds_exactly_the_library_regopy_loaded():
    assert rego._native is regopy.rego_shared.rego
    assert isinstance(regopy.rego_shared.rego, ctypes.CDLL)


@pytest.mark.parametrize("name", sorted(NATIVE_SIGNATURES))
def test_native_function_signature(name):
    argtypes, restype = NATIVE_SIGNATURES[name]
    function = getattr(regopy.rego_shared.rego, name)
    assert list(function.argtypes) == argtypes, f"{name}.argtypes changed"
    assert function.restype is restype, f"{name}.restype changed"


@pytest.mark.parametrize("name", sorted(SHARED_HELPERS))
def test_shared_helper_signature(name):
    function = getattr(regopy.rego_shared, name)
    signature = inspect.signature(function)
    assert tuple(signature.parameters) == SHARED_HELPERS[name]
    assert signature.return_annotation in (str, "str")


def test_regopy_error_is_an_exception():
    assert issubclass(regopy.RegoError, Exception)


def test_interpreter_and_bundle_expose_native_handles():
    interpreter = regopy.Interpreter()
    interpreter.add_module("p.rego", "package p\nimport rego.v1\nx := input.a\n")
    bundle = interpreter.build(None, ["p/x"])
    for owner in (interpreter, bundle):
        assert isinstance(owner._impl, int), f"{type(owner).__name__}._impl is not a handle"
        assert owner._impl != 0
    # and the helpers read through those handles: an output's JSON text, an interpreter's error
    handle = rego._input_handle({"a": 7})
    try:
        assert regopy.rego_shared.rego.regoSetInput(interpreter._impl, handle) == 0
    finally:
        regopy.rego_shared.rego.regoFreeInput(handle)
    output = regopy.rego_shared.rego.regoBundleQueryEntrypoint(interpreter._impl, bundle._impl, b"p/x")
    assert output
    try:
        assert regopy.rego_shared.rego.regoOutputOk(output) is True
        assert '"expressions":[7]' in regopy.rego_shared.rego_output_string(output).replace(" ", "")
    finally:
        regopy.rego_shared.rego.regoFreeOutput(output)
    assert isinstance(regopy.rego_shared.rego_get_error(interpreter._impl), str)


def test_the_installed_regopy_is_the_tested_minor_and_pyproject_pins_it():
    installed = Version(importlib.metadata.version("regopy"))
    assert installed.release[:2] == TESTED_MINOR, (
        f"regopy {installed} is installed; this file was checked against {TESTED_MINOR}"
    )
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (pin,) = [
        Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == "regopy"
    ]
    major, minor = TESTED_MINOR
    assert installed in pin.specifier
    assert Version(f"{major}.{minor + 1}.0") not in pin.specifier, "pin regopy below the next minor"
    if minor:
        assert Version(f"{major}.{minor - 1}.0") not in pin.specifier, "pin regopy above the last minor"
