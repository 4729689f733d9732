"""Request fields that constrain the output -> one StructuredOutputs (or a 400 naming the field).

OpenAI's `response_format` and vLLM's extensions (`structured_outputs`, `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar`) all land on the same xgrammar engine. At most
one may be given. A JSON schema is checked against its metaschema here (jsonschema), then
compiled off the event loop; either failing is a 400 naming the field, never a 500 and never a
silently unconstrained answer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pagedserve.core.engine_client import EngineClient
from pagedserve.core.sampling_params import StructuredOutputs
from pagedserve.core.structured import GrammarError
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    StructuredOutputsField,
)

MAX_SCHEMA_CHARS = 200_000
"""A larger schema is refused before compiling (compile time grows with it)."""


def structured_outputs(req: ChatCompletionRequest | CompletionRequest) -> StructuredOutputs | None:
    """The one constraint the request asks for, validated; None when it asks for none."""
    found = [spec for spec in _candidates(req) if spec is not None]
    if len(found) > 1:
        names = ", ".join(spec.param for spec in found)
        raise errors.invalid(f"Give at most one output constraint, got {names}.", found[1].param)
    return found[0] if found else None


def _candidates(req: ChatCompletionRequest | CompletionRequest) -> list[StructuredOutputs | None]:
    out: list[StructuredOutputs | None] = []
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        out.append(StructuredOutputs("json_object", param="response_format"))
    elif fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        out.append(json_schema_spec(fmt.json_schema.json_schema or {}, "response_format"))
    if req.structured_outputs is not None:
        out.append(_vllm_field(req.structured_outputs))
    if req.guided_json is not None:
        out.append(json_schema_spec(req.guided_json, "guided_json"))
    if req.guided_regex is not None:
        out.append(_text_spec("regex", req.guided_regex, "guided_regex"))
    if req.guided_choice is not None:
        out.append(choice_spec(req.guided_choice, "guided_choice"))
    if req.guided_grammar is not None:
        out.append(_text_spec("ebnf", req.guided_grammar, "guided_grammar"))
    return out


def _vllm_field(field: StructuredOutputsField) -> StructuredOutputs:
    param = "structured_outputs"
    given = [
        name for name in ("json_", "regex", "choice", "grammar", "json_object")
        if getattr(field, name) not in (None, False)
    ]  # fmt: skip
    if len(given) != 1:
        raise errors.invalid("structured_outputs needs exactly one of json, regex, choice, "
                             "grammar, json_object.", param)  # fmt: skip
    if field.json_ is not None:
        return json_schema_spec(field.json_, param)
    if field.regex is not None:
        return _text_spec("regex", field.regex, param)
    if field.choice is not None:
        return choice_spec(field.choice, param)
    if field.grammar is not None:
        return _text_spec("ebnf", field.grammar, param)
    return StructuredOutputs("json_object", param=param)


def json_schema_spec(schema: dict[str, Any] | str, param: str) -> StructuredOutputs:
    """A checked JSON schema (dict, or its JSON text) as a constraint."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise errors.invalid(f"{param}: the schema is not valid JSON: {exc}", param) from exc
    if not isinstance(schema, dict):
        raise errors.invalid(f"{param}: the schema must be a JSON object.", param)
    # Here, with the first schema: with its format checkers' packages jsonschema is ~3 MiB
    # resident that a server never asked for a schema does not need (issue 42 item 4).
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except (jsonschema.SchemaError, jsonschema.exceptions.UnknownType) as exc:
        raise errors.invalid(f"{param}: invalid JSON schema: {exc.message}", param) from exc
    except Exception as exc:  # e.g. a $schema naming an unknown draft, a bad regex pattern
        raise errors.invalid(f"{param}: invalid JSON schema: {exc}", param) from exc
    text = json.dumps(schema, ensure_ascii=False)
    _check_size(text, param)
    return StructuredOutputs("json_schema", text, param=param)


def choice_spec(choices: list[str], param: str) -> StructuredOutputs:
    if not choices or not all(choices):
        raise errors.invalid(f"{param} must be a non-empty list of non-empty strings.", param)
    return StructuredOutputs("choice", json.dumps(choices, ensure_ascii=False), param=param)


def _text_spec(kind: str, text: str, param: str) -> StructuredOutputs:
    if not text:
        raise errors.invalid(f"{param} must not be empty.", param)
    _check_size(text, param)
    return StructuredOutputs(kind, text, param=param)


def _check_size(text: str, param: str) -> None:
    if len(text) > MAX_SCHEMA_CHARS:
        raise errors.invalid(f"{param} is too large (over {MAX_SCHEMA_CHARS} characters).", param)


async def compile_off_loop(engine: EngineClient, spec: StructuredOutputs | None) -> None:
    """Compile (or find in the LRU) the grammar on a worker thread, so a large schema never
    stalls the other streams; a grammar that does not compile is a 400 naming the field."""
    if spec is None:
        return
    try:
        await asyncio.to_thread(engine.compile_grammar, spec)
    except GrammarError as exc:
        raise errors.invalid(exc.message, exc.param) from exc
