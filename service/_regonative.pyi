"""Types of the optional C accelerator built from service/_regonative.c."""

from typing import Any

def bind(
    string: int, int_: int, float_: int, boolean: int, null: int, object_item: int, object_: int,
    array: int, /,
) -> None: ...
def build(handle: int, value: Any, /) -> None: ...
