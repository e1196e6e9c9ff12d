"""What the decision cache may key on: the input fields a Rego rule can read (apps.policy._rego_refs).

Every wrong answer here must be on the safe side (None, "may read everything"): a field missed would let two inputs
that differ in it share a decision."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from apps.policy._rego_refs import code_only, input_fields, rule_fields

BUILTIN = Path(settings.BASE_DIR) / "policies"


def _module(package: str, body: str) -> str:
    return f"package {package}\nimport rego.v1\n{body}\n"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('allow if input.namespace[0] == "user"', {"namespace"}),
        ('allow if input["namespace"][0] == "user"', {"namespace"}),
        ('allow if input [ "key" ] == "k"', {"key"}),
        ("allow if input.context.user_id == input.namespace[1]", {"context", "namespace"}),
        ("import input.value as v\nallow if v.x", {"value"}),
        ("allow if true", set()),
        # Strings and comments are not code.
        ('# input[x] and input in a comment\nallow if input.key == "input"', {"key"}),
        ('allow if input.key == "a # b"; x := input.value', {"key", "value"}),
        ("allow if input.key == `raw input`", {"key"}),
        ('allow if input.key == "esc\\"aped input"', {"key"}),
        # Identifiers that only contain the word.
        ("my_input := 1\ninputs := 2\nallow if input.key", {"key"}),
    ],
)
def test_fields_read(body, expected):
    assert input_fields(_module("memories.authz", body)) == frozenset(expected)


@pytest.mark.parametrize(
    "body",
    [
        "allow if input",
        "allow if input[x] == 1",
        'allow if object.get(input, "value", {}) == {}',
        "allow if walk(input, [p, v])",
        "import input\nallow if input.key",
        "allow if x with input as {}",
        'allow if input["esc\\u0061ped"] == 1',  # an escaped key is not worth decoding
        "allow if y.input == 1",
        "allow if input.\nkey",
        'allow if "unterminated',
        "allow if `unterminated",
    ],
)
def test_anything_else_reads_everything(body):
    assert input_fields(_module("memories.authz", body)) is None


def test_code_only_keeps_offsets_and_newlines():
    text = 'a := "in#put" # note\nb := `r\nq`\n'
    code = code_only(text)
    assert len(code) == len(text)
    assert code.count("\n") == text.count("\n")
    assert "input" not in code and "note" not in code and "a :=" in code and "b :=" in code


def test_builtin_policies():
    texts = [(BUILTIN / name).read_text() for name in ("authz.rego", "attributes.rego", "filter.rego")]
    assert rule_fields("memories/authz/decision", texts) == {"namespace", "context"}
    assert rule_fields("memories/attributes/attributes", texts) == {"namespace"}
    assert rule_fields("memories/filter", texts) is None  # object.get(input, ...)


def test_rule_fields_unions_every_module_of_the_package_and_its_parents():
    authz = _module("memories.authz", "decision := {} if input.namespace")
    more = _module("memories.authz", "extra if input.key")
    parent = _module("memories", "authz := {} if input.index")
    other = _module("memories.attributes", "attributes := input.value")
    assert rule_fields("memories/authz/decision", [authz, more, parent, other]) == {"namespace", "key", "index"}
    assert rule_fields("memories/attributes/attributes", [authz, other]) == {"value"}


def test_a_data_reference_reaches_every_module():
    authz = _module("memories.authz", "decision := {} if data.memories.helpers.ok")
    helpers = _module("memories.helpers", "ok if input.value.secret")
    assert rule_fields("memories/authz/decision", [authz, helpers]) == {"value"}
    imported = _module("memories.authz", "import data.memories.helpers\ndecision := {} if helpers.ok")
    assert rule_fields("memories/authz/decision", [imported, helpers]) == {"value"}


def test_a_module_without_a_readable_package_reads_everything():
    authz = _module("memories.authz", "decision := {} if input.namespace")
    assert rule_fields("memories/authz/decision", [authz, "import rego.v1\nx := 1\n"]) is None
    assert rule_fields("memories/authz/decision", [authz, 'package memories.x\ns := "open\n']) is None
