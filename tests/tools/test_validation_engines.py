"""jsonschema-rs decides the common case of a call's validation and of a declaration's schema check;
python-jsonschema words every problem. These tests hold the two to one verdict: on generated schemas
and arguments, the ToolValidator's errors are exactly python-jsonschema's, and the declarations'
fast schema check never accepts what python-jsonschema's check_schema rejects."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing.exceptions import Unresolvable

from eyrie.jobs.jsonvalues import canonical_json, json_pointer
from eyrie.jobs.tools import declarations, validation
from eyrie.jobs.tools.declarations import _meta_valid
from eyrie.jobs.tools.textcalls import find_calls
from eyrie.jobs.tools.validation import ToolValidator, _Schema, error_message

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(-5, 5, allow_nan=False, width=32),
                    st.sampled_from(["", "a", "ab", "Paris", "٣", "abc\n", "1"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from("abcd"), inner, max_size=3)),
                      max_leaves=8)
TYPES = st.sampled_from(["string", "number", "integer", "boolean", "object", "array", "null"])
SMALL = st.integers(0, 3)


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    leaf = st.one_of(
        st.fixed_dictionaries({"type": st.one_of(TYPES, st.lists(TYPES, min_size=1, max_size=2, unique=True))}),
        st.fixed_dictionaries({"enum": st.lists(SCALARS, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"const": SCALARS}),
        st.fixed_dictionaries({"minimum": st.integers(-3, 3)}, optional={"exclusiveMaximum": st.integers(-3, 5)}),
        st.fixed_dictionaries({"type": st.just("string")},
                              optional={"minLength": SMALL, "maxLength": SMALL, "format": st.sampled_from(
                                  ["date", "email", "uuid"]),
                                  "pattern": st.sampled_from(["^\\d+$", "^[A-Z]{3}$", "a$"])}),
        st.fixed_dictionaries({"multipleOf": st.sampled_from([0.1, 2, 0.5])}),
        st.just({}), st.just({"not": {"type": "null"}}),
    )

    def branch(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
        return st.one_of(
            st.fixed_dictionaries(
                {"type": st.just("object"), "properties": st.dictionaries(st.sampled_from("abcd"), inner, max_size=3)},
                optional={"required": st.lists(st.sampled_from("abcd"), max_size=3, unique=True),
                          "additionalProperties": st.one_of(st.booleans(), inner),
                          "minProperties": SMALL}),
            st.fixed_dictionaries({"type": st.just("array"), "items": inner},
                                  optional={"minItems": SMALL, "maxItems": SMALL, "uniqueItems": st.booleans()}),
            st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=2)}),
            st.fixed_dictionaries({"oneOf": st.lists(inner, min_size=1, max_size=2)}),
            st.fixed_dictionaries({"allOf": st.lists(inner, min_size=1, max_size=2)}),
            st.fixed_dictionaries({"$defs": st.fixed_dictionaries({"x": inner}), "$ref": st.just("#/$defs/x")}),
        )

    return st.recursive(leaf, branch, max_leaves=6)


def python_errors(schema: dict[str, Any], value: Any, most: int = 10, cap: int = 300) -> list[dict[str, str]] | str:
    """What eyrie recorded before jsonschema-rs: python-jsonschema's errors alone, each message as eyrie words it
    (`error_message`: a renamed argument named beside the missing one), or the exception
    that makes the call's verdict "the declared schema could not be applied"."""
    try:
        return [{"path": json_pointer(e.absolute_path), "message": error_message(e)[:cap]}
                for e in itertools.islice(Draft202012Validator(schema).iter_errors(value), most)]
    except (Unresolvable, RecursionError) as e:
        return type(e).__name__


def hybrid_errors(schema: dict[str, Any], value: Any) -> list[dict[str, str]] | str:
    try:
        return _Schema(schema).errors(value, 10, 300)
    except (Unresolvable, RecursionError) as e:
        return type(e).__name__


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_schemas(), VALUES)
def test_the_fast_validator_never_changes_a_verdict_or_a_message(schema: dict[str, Any], value: Any) -> None:
    assert hybrid_errors(schema, value) == python_errors(schema, value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_schemas(), st.dictionaries(st.sampled_from("abcd"), VALUES, max_size=4))
def test_a_call_is_judged_as_python_jsonschema_judges_it(schema: dict[str, Any], args: dict[str, Any]) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    got = ToolValidator([tool]).check_calls([{"function": {"name": "f", "arguments": orjson.dumps(args).decode()}}])
    expected = python_errors(orjson.loads(canonical_json(schema)), args)  # compiled from its canonical JSON, as always
    if isinstance(expected, str):
        assert not got[0].valid and got[0].errors[0]["message"].startswith("the declared schema could not be applied")
    else:
        assert (got[0].valid, got[0].errors) == (not expected, expected)


def test_the_fast_path_is_taken_for_plain_schemas_and_not_for_those_read_differently() -> None:
    plain = {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {
        "type": "string", "enum": ["a", "b"]}}}, "required": ["id"]}
    assert _Schema(plain).fast is not None
    for risky in ({"type": "string", "pattern": "^\\d+$"}, {"multipleOf": 0.1}, {"uniqueItems": True},
                  {"$schema": "http://json-schema.org/draft-07/schema#"}, {"$ref": "https://example.com/s.json"},
                  {"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"},
                  {"type": "object", "properties": {"pattern": {"type": "string"}}}):
        assert _Schema(risky).fast is None, risky


@pytest.mark.parametrize(("schema", "value"), [
    ({"type": "string", "pattern": "^\\d+$"}, "٣"),  # Python's \d takes any decimal digit, ECMA's only 0-9
    ({"type": "string", "pattern": "^\\s$"}, "\ufeff"),  # ECMA's \s takes U+FEFF, Python's not: rs says valid
    ({"multipleOf": 0.1}, 0.3),  # python-jsonschema: 0.3 / 0.1 is not integral
    ({"type": "object", "properties": {"a": {"type": "number"}}}, {"a": float("nan")}),  # rs: NaN is no number
    ({"type": "object"}, {1: "x"}),  # a Python literal's int key: jsonschema-rs refuses the value
])
def test_where_the_engines_differ_python_jsonschema_decides(schema: dict[str, Any], value: Any) -> None:
    assert _Schema(schema).errors(value, 10, 300) == python_errors(schema, value)


def test_a_reference_is_never_fetched_and_an_unresolvable_one_is_reported() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}
    v = ToolValidator([tool]).check_calls([{"function": {"name": "f", "arguments": '{"a": 1}'}}])[0]
    assert not v.valid and v.errors[0]["message"].startswith("the declared schema could not be applied: ")


BAD_KEYWORDS = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["str", "int", "object", 3])}),
    st.fixed_dictionaries({"minLength": st.sampled_from([-1, 1.5, "2", 2])}),
    st.fixed_dictionaries({"required": st.sampled_from(["a", ["a", "a"], ["a"], [1]])}),
    st.fixed_dictionaries({"pattern": st.sampled_from(["[a", "(?P<x>a)", "^a$", "\\p{L}", 3])}),
    st.fixed_dictionaries({"patternProperties": st.sampled_from([{"[": {}}, {"^a": {}}, {"^a": 3}])}),
    st.fixed_dictionaries({"enum": st.sampled_from([[], [1], "x"])}),
    st.fixed_dictionaries({"properties": st.sampled_from([{"a": 3}, {"a": {}}, []])}),
    st.fixed_dictionaries({"$ref": st.sampled_from(["#/x", "not a uri ::", 3])}),
    st.fixed_dictionaries({"$schema": st.sampled_from(["http://json-schema.org/draft-07/schema#", "x"])}),
)


@settings(max_examples=250, deadline=None)
@given(st.recursive(BAD_KEYWORDS, lambda inner: st.fixed_dictionaries(
    {"type": st.just("object"), "properties": st.dictionaries(st.sampled_from("ab"), inner, max_size=2)}),
    max_leaves=4))
def test_the_fast_schema_check_accepts_only_what_check_schema_accepts(schema: dict[str, Any]) -> None:
    try:
        Draft202012Validator.check_schema(schema)
        python_ok = True
    except SchemaError:
        python_ok = False
    if _meta_valid(schema):
        assert python_ok, schema
    # and the verdict a declaration gets is python-jsonschema's either way
    assert (declarations._schema_problem_uncached(canonical_json(schema)) is None) == python_ok


def test_a_schema_check_problem_is_worded_by_python_jsonschema() -> None:
    problem = declarations._schema_problem_uncached(canonical_json({"type": "object", "properties": {
        "a": {"type": "string", "pattern": "[a"}}}))
    assert problem == "'[a' is not a 'regex' at /properties/a/pattern"
    assert validation._read_alike({"type": "object"})


@pytest.mark.parametrize("args", [{"a": (1, 2)}, {"a": ()}, {"a": [1, (2,)], "b": (3,)}])
def test_arguments_holding_python_values_are_judged_by_python_jsonschema(args: dict[str, Any]) -> None:
    """A call written as a Python literal may hold a tuple: jsonschema-rs reads it as an array,
    python-jsonschema does not, and its verdict is the one recorded."""
    schema = {"type": "object", "properties": {"a": {"type": "array"}, "b": {"type": "array"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    got = ToolValidator([tool]).check_calls([{"function": {"name": "f", "arguments": args}}])[0]
    expected = python_errors(schema, args)
    assert expected and (got.valid, got.errors) == (False, expected)


@pytest.mark.parametrize("args", ["{'a': (1, 2)}", "{'a': [1, (2,)], 'b': (3,)}"])
def test_a_literal_written_as_text_is_judged_by_python_jsonschema_too(args: str) -> None:
    """A Hermes block read as a Python literal is not known to hold JSON's values (`json_values`
    False), so its tuple reaches python-jsonschema as in a structured call; a block read as JSON is."""
    schema = {"type": "object", "properties": {"a": {"type": "array"}, "b": {"type": "array"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    found = find_calls(f"<tool_call>{{'name': 'f', 'arguments': {args}}}</tool_call>", {"f"})
    assert [c.json_values for c in found] == [False]
    got = ToolValidator([tool]).check_text_calls(found)[0]
    expected = python_errors(schema, found[0].arguments)
    assert expected and (got.valid, got.errors) == (False, expected)
    as_json = find_calls('<tool_call>{"name": "f", "arguments": {"a": [1, 2]}}</tool_call>', {"f"})
    assert [c.json_values for c in as_json] == [True]
    assert ToolValidator([tool]).check_text_calls(as_json)[0].valid
