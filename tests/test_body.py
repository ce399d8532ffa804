"""service/body.py's bounds, without HTTP: nesting before parsing, then the parsed document."""

from __future__ import annotations

import json
import time

import pytest

from service import limits
from service.body import check_document, check_nesting
from service.limits import MAX_JSON_DEPTH, MAX_JSON_VALUE_BYTES


def test_nesting_up_to_the_bound_passes_and_one_more_is_refused():
    check_nesting("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    with pytest.raises(limits.TooDeep):
        check_nesting("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(limits.TooDeep):
        check_nesting('{"a":' * 100_000 + "1" + "}" * 100_000)  # never recurses


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"s": "[" * 1000, "t": '\\"[[[[', "u": ["{" * 500]})
    check_nesting(text)
    check_document(json.loads(text))


def test_many_shallow_brackets_are_cheap():
    text = "[" + ",".join(["[]"] * 200_000) + "]"
    # CPU time of this process (a loaded machine does not add to it): linear is milliseconds,
    # quadratic in the 200 000 brackets would be minutes.
    started = time.process_time()
    check_nesting(text)
    assert time.process_time() - started < 2.0


@pytest.mark.parametrize(("document", "refused", "pointer"), [
    ({"a": ["x", "y\0"]}, limits.InvalidString, "/a/1"),
    ({"a": {"k\ud800": 1}}, limits.InvalidString, "/a"),
    ({"a/b": "\udc00"}, limits.InvalidString, "/a~1b"),
    ({"n": [1, 2**53]}, limits.InvalidNumber, "/n/1"),
    ({"n": -(2**53)}, limits.InvalidNumber, "/n"),
    ({"f": float("inf")}, limits.InvalidNumber, "/f"),
    ({"big": "x" * MAX_JSON_VALUE_BYTES}, limits.TooLarge, "/big"),
    ("x" * MAX_JSON_VALUE_BYTES, limits.TooLarge, ""),
])
def test_refused_documents_name_where(document, refused, pointer):
    with pytest.raises(refused) as caught:
        check_document(document)
    assert caught.value.pointer == pointer


def test_the_bounds_themselves_pass():
    check_document({"n": [2**53 - 1, -(2**53 - 1), 1.5e300], "s": "é\t\n\u2028😀",
                    "big": "x" * (MAX_JSON_VALUE_BYTES - 2)})


def test_long_integer_literals_are_never_converted():
    # CPU time (see above): converting 100 000 digits is quadratic, refusing them is not.
    started = time.process_time()
    parsed = json.loads("[" + "9" * 100_000 + "]", parse_int=limits.parse_int)
    with pytest.raises(limits.InvalidNumber) as caught:
        check_document(parsed)
    assert caught.value.pointer == "/0"
    assert time.process_time() - started < 1.0
    assert limits.parse_int("-9007199254740991") == -(2**53 - 1)
