"""One Rego lexer: the decision cache key (``inputrefs``) and the authoring tools (``regosrc``:
lint, coverage, the test runner) read the same tokens from the same text.

Two lexers used to disagree: the tools' one read a form feed as an unknown character (so a rule
indented by one was glued to the rule before it and vanished from lint and coverage) and split a
template string ``$"...{input.x}..."`` into an unknown ``$`` and a plain string. A disagreement on
the key's side is a security matter: a path the key misses lets two inputs the policy tells apart
share one cached decision, so the key is checked here on rules that read ``input`` next to the
literals a lexer most easily gets wrong.
"""

from __future__ import annotations

import pytest

from service.authz import inputrefs, regosrc
from service.authz.regolex import tokenize

_PATH = ("resource", "value", "x")

_TRICKY = [
    # a string holding an escaped quote and a comment sign
    'allow if { input.resource.value.x == "a\\"# not a comment" }',
    # a raw string holding a double quote, a comment sign and a newline
    'allow if {\n  input.resource.value.x == `"#\n{`\n}',
    # a comment holding a quote and a backtick, then the read on the next line
    'allow if {\n  # "` input.other\n  input.resource.value.x == "y"\n}',
    # the read right after a string ending in an escaped backslash
    'allow if { "\\\\" == "\\\\"; input.resource.value.x == 1 }',
    # the read inside brackets, after a raw string with a bracket in it
    'allow if { v := [`]`, input.resource.value.x]; v[1] == 1 }',
    # a negative number right before the read
    'allow if { -1 < input.resource.value.x }',
    # a rule indented by a form feed (whitespace to the compiler)
    'base := 1\n\fallow if { input.resource.value.x == 2 }',
]


@pytest.mark.parametrize("body", _TRICKY)
def test_key_holds_the_path_read_next_to_tricky_literals(body: str) -> None:
    source = f"package controlplane.authz\n\n{body}\n"
    refs = inputrefs.analyse([source])
    assert refs.paths is not None and _PATH in refs.paths, refs
    keyed = inputrefs.key_paths(refs.paths)
    one = inputrefs.cache_key(keyed, {"action": "a", "env": "dev", "resource": {"value": {"x": 1}}})
    two = inputrefs.cache_key(keyed, {"action": "a", "env": "dev", "resource": {"value": {"x": 2}}})
    assert one != two
    # ... and the tools read the same rule with the same read in its body.
    info = regosrc.parse_module("p.rego", source)
    assert "allow" in info.rule_names()
    (rule,) = [r for r in info.rules if r.name == "allow"]
    assert "input.resource.value.x" in " ".join(e.text for b in rule.bodies for e in b.exprs)


def test_a_rule_indented_by_a_form_feed_is_a_rule_for_the_tools() -> None:
    source = "package p\n\na := 1\n\fb := input.resource.value.x\n"
    assert regosrc.parse_module("p.rego", source).rule_names() == {"a", "b"}
    assert inputrefs.analyse([source]).paths == (_PATH,)


def test_a_template_string_is_one_token_and_keys_on_the_whole_input() -> None:
    source = 'package p\n\nmsg := $"id {input.resource.value.x} `{input.y}`"\n'
    kinds = [t.kind for t in tokenize(source) if t.kind != "newline"]
    assert kinds == ["ident", "ident", "ident", "op", "template"]
    # Its interpolations read the input: the key cannot bound them.
    assert inputrefs.analyse([source]).whole_input


def test_an_unknown_character_keys_on_the_whole_input() -> None:
    source = "package p\n\nallow if { input.a == 1 } \u00a7\n"
    assert [t.text for t in tokenize(source) if t.kind == "other"] == ["\u00a7"]
    assert inputrefs.analyse([source]).whole_input
