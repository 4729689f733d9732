"""Structured output through the real OpenAI SDK against a real server (default model):
`chat.completions.parse`, json_object, json_schema (validated with jsonschema), vLLM's guided_*
extensions, streaming, completions, and the 400s for what cannot be compiled."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from bench.common.server import API_KEY, Server

ASK = [{"role": "user", "content": "Describe a person as JSON."}]
LIMITS = {"max_tokens": 80, "temperature": 0}

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 16},
                               "zip": {"type": "integer", "minimum": 0, "maximum": 99999}},
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "array-of-enums": {
        "type": "object",
        "properties": {"colors": {"type": "array", "minItems": 1, "maxItems": 3,
                                  "items": {"enum": ["red", "green", "blue"]}}},
        "required": ["colors"],
    },
    "optional-and-boolean": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "score": {"type": "number"},
                       "note": {"type": "string", "maxLength": 10}},
        "required": ["ok"],
    },
}  # fmt: skip


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)
    role: Literal["admin", "user"]


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def test_parse_with_a_pydantic_model(client: openai.OpenAI, server: Server) -> None:
    done = client.chat.completions.parse(
        model=server.model, messages=ASK, response_format=Person, **LIMITS
    )
    assert isinstance(done.choices[0].message.parsed, Person)


def test_json_object(client: openai.OpenAI, server: Server) -> None:
    out = client.chat.completions.create(
        model=server.model, messages=ASK, response_format={"type": "json_object"},
        max_tokens=24, temperature=0,
    )  # fmt: skip
    choice = out.choices[0]
    text = choice.message.content or ""
    assert text.startswith("{")
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    ("name", "strict"),
    [("nested", True), ("array-of-enums", False), ("optional-and-boolean", None)],
)
def test_json_schema_validates(client: openai.OpenAI, server: Server, name: str, strict) -> None:
    schema = SCHEMAS[name]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}
    out = client.chat.completions.create(
        model=server.model, messages=ASK, response_format=fmt, **LIMITS
    )
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)


def test_streamed_json_concatenates_to_valid_json(client: openai.OpenAI, server: Server) -> None:
    schema = SCHEMAS["nested"]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    stream = client.chat.completions.create(
        model=server.model, messages=ASK, response_format=fmt, stream=True, n=2, seed=1,
        max_tokens=80, temperature=0.7,
    )  # fmt: skip
    texts = ["", ""]
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    for text in texts:
        jsonschema.validate(json.loads(text), schema)


def test_completions_with_response_format(client: openai.OpenAI, server: Server) -> None:
    schema = SCHEMAS["array-of-enums"]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    whole = client.completions.create(
        model=server.model, prompt="Colors as JSON:", extra_body={"response_format": fmt},
        max_tokens=40, temperature=0,
    )  # fmt: skip
    jsonschema.validate(json.loads(whole.choices[0].text), schema)
    streamed = client.completions.create(
        model=server.model, prompt="Colors as JSON:", extra_body={"response_format": fmt},
        max_tokens=40, temperature=0, stream=True,
    )  # fmt: skip
    jsonschema.validate(json.loads("".join(c.choices[0].text for c in streamed)), schema)


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
        ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, lambda t: len(t) == 6 and t[3] == "-"),
        ({"guided_grammar": 'root ::= "The answer is " ("A" | "B") "."'},
         lambda t: t in ("The answer is A.", "The answer is B.")),
        ({"structured_outputs": {"choice": ["left", "right"]}}, lambda t: t in ("left", "right")),
        ({"guided_json": {"type": "object", "properties": {"n": {"type": "integer",
          "minimum": 0, "maximum": 9}}, "required": ["n"]}}, lambda t: 0 <= json.loads(t)["n"] <= 9),
    ],
)  # fmt: skip
def test_vllm_extensions(client: openai.OpenAI, server: Server, extra: dict, check) -> None:
    out = client.chat.completions.create(
        model=server.model, messages=ASK, extra_body=extra, max_tokens=30, temperature=0
    )
    assert check(out.choices[0].message.content), out.choices[0].message.content


def test_max_tokens_before_the_json_closes_is_length(client: openai.OpenAI, server) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMAS["nested"]}}
    out = client.chat.completions.create(
        model=server.model, messages=ASK, response_format=fmt, max_tokens=4, temperature=0
    )
    assert out.choices[0].finish_reason == "length"
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(
            model=server.model, messages=ASK, response_format=Person, max_tokens=4
        )


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
          "schema": {"type": "object", "properties": {"a": {"type": 5}}}}}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
          "schema": {"type": "object", "required": "a"}}}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"guided_grammar": "root ::= missing"}, "guided_grammar"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
        ({"guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
    ],
)  # fmt: skip
def test_bad_constraints_are_400_naming_the_field(
    client: openai.OpenAI, server: Server, extra: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model=server.model, messages=ASK, extra_body=extra, max_tokens=4
        )
    assert bad.value.body["param"] == param, bad.value.body
