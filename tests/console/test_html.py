"""The console's template helper: every value is text unless it is already-rendered Markup."""

from __future__ import annotations

import pytest

from service.console.html import Markup, escape, join, render
from service.console.pages import command_text


@pytest.mark.parametrize("value", [
    pytest.param("<script>alert(1)</script>", id="element"),
    pytest.param('" onmouseover="alert(1)', id="attribute-break-out"),
    pytest.param("' autofocus onfocus='alert(1)", id="single-quoted"),
    pytest.param("&lt;already&gt;", id="entities-are-text-too"),
])
def test_values_are_escaped_in_text_and_attributes(value):
    out = render('<a title="$v" data-x=\'$v\'>$v</a>', v=value)
    assert "<script" not in out and '" on' not in out and "' on" not in out and "' autofocus" not in out
    assert out.count("<a ") == 1 and out.endswith("</a>")


def test_markup_passes_through_and_plain_strings_do_not():
    inner = render("<b>$x</b>", x="<i>")
    assert inner == "<b>&lt;i&gt;</b>" and isinstance(inner, Markup)
    assert render("<p>$m</p>", m=inner) == "<p><b>&lt;i&gt;</b></p>"
    assert join([inner, "<i>"]) == "<b>&lt;i&gt;</b>&lt;i&gt;"
    assert escape(None) == "" and escape(3) == "3"


def test_commands_read_as_one_line():
    assert command_text(None) is None
    assert command_text("helm upgrade web ./chart") == "helm upgrade web ./chart"
    assert command_text(["sh", "-c", "echo 'a b'"]) == "sh -c 'echo '\"'\"'a b'\"'\"''"
    assert command_text(["mysql", "--password", "***", "-e", "select 1"]) == \
        "mysql --password *** -e 'select 1'"
