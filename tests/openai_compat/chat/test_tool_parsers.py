"""Tool-call parsers on recorded outputs of each family's format: the whole-text result, and the
same text streamed cut at every character (and one character at a time) assembles the same."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from pagedserve.openai_compat.chat.tool_parsers import (
    PARSERS,
    NamedParser,
    ParsedDelta,
    RequiredParser,
    ToolParser,
    parse_all,
    parser_for_template,
)
from pagedserve.openai_compat.chat.tool_parsers.base import fold_calls

WEATHER = {"city": "Paris", "unit": "celsius", "note": 'say "hi" {not a brace}'}
TIME = {"tz": "Europe/Paris"}
W, T = json.dumps(WEATHER), json.dumps(TIME)

# (parser factory, recorded output, expected content, expected [(name, arguments)])
CASES: list[tuple[str, Callable[[], ToolParser], str, str | None, list[tuple[str, dict]]]] = [
    ("hermes-one", PARSERS["hermes"],
     f'<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>',
     None, [("get_weather", WEATHER)]),
    ("hermes-text-then-two", PARSERS["hermes"],
     f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>\n'
     f'<tool_call>\n{{"arguments": {T}, "name": "get_time"}}\n</tool_call>',
     "Let me check.", [("get_weather", WEATHER), ("get_time", TIME)]),
    ("hermes-plain-text", PARSERS["hermes"], "No tools needed: <tool> is not a call. a < b",
     "No tools needed: <tool> is not a call. a < b", []),
    ("hermes-broken-json", PARSERS["hermes"], "<tool_call>\nnot json\n</tool_call>",
     "<tool_call>\nnot json\n</tool_call>", []),
    ("hermes-string-arguments", PARSERS["hermes"],
     '<tool_call>{"name": "get_time", "arguments": "{\\"tz\\": \\"Europe/Paris\\"}"}</tool_call>',
     None, [("get_time", TIME)]),
    ("llama3-one", PARSERS["llama3_json"], f'{{"name": "get_weather", "parameters": {W}}}',
     None, [("get_weather", WEATHER)]),
    ("llama3-python-tag-two", PARSERS["llama3_json"],
     f'<|python_tag|>{{"name": "get_weather", "parameters": {W}}}; '
     f'{{"name": "get_time", "parameters": {T}}}',
     None, [("get_weather", WEATHER), ("get_time", TIME)]),
    ("llama3-json-content", PARSERS["llama3_json"], '{"answer": 42}', '{"answer": 42}', []),
    ("llama3-text", PARSERS["llama3_json"], "The weather is nice.", "The weather is nice.", []),
    ("mistral-array", PARSERS["mistral"],
     f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {W}}}, '
     f'{{"name": "get_time", "arguments": {T}}}]',
     None, [("get_weather", WEATHER), ("get_time", TIME)]),
    ("mistral-v11", PARSERS["mistral"],
     f"Sure.[TOOL_CALLS]get_weather[ARGS]{W}[TOOL_CALLS]get_time[ARGS]{T}",
     "Sure.", [("get_weather", WEATHER), ("get_time", TIME)]),
    ("mistral-text", PARSERS["mistral"], "[TOOL] is not [TOOL_CALL", "[TOOL] is not [TOOL_CALL", []),
    ("required", RequiredParser,
     f'[{{"name": "get_weather", "parameters": {W}}}, {{"name": "get_time", "parameters": {T}}}]',
     None, [("get_weather", WEATHER), ("get_time", TIME)]),
    ("named", lambda: NamedParser("get_weather"), W, None, [("get_weather", WEATHER)]),
]  # fmt: skip


def assemble(parser: ToolParser, pieces: list[str]) -> tuple[str | None, list[tuple[str, dict]]]:
    total = ParsedDelta()
    for piece in pieces:
        total.extend(parser.feed(piece))
    total.extend(parser.finish())
    starts = [d for d in total.calls if d.name is not None]
    assert all(d.id and d.id.startswith("call_") for d in starts)  # id and name come first
    assert [d.index for d in starts] == list(range(len(starts)))
    calls = fold_calls(total.calls)
    content = total.content or None
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_whole_text(case) -> None:
    _, factory, text, content, calls = case
    got_content, got_calls = parse_all(factory(), text)
    assert (got_content or None) == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_streamed_cut_at_every_character(case) -> None:
    _, factory, text, content, calls = case
    for cut in range(len(text) + 1):
        assert assemble(factory(), [text[:cut], text[cut:]]) == (content, calls), cut
    assert assemble(factory(), list(text)) == (content, calls)


def test_streamed_arguments_arrive_in_fragments() -> None:
    parser = PARSERS["hermes"]()
    deltas = []
    text = f'<tool_call>{{"name": "get_weather", "arguments": {W}}}</tool_call>'
    for ch in text:
        deltas.extend(parser.feed(ch).calls)
    assert deltas[0].name == "get_weather" and deltas[0].arguments == ""
    assert len(deltas) > 10  # arguments streamed as they grow, not in one piece at the end
    assert "".join(d.arguments for d in deltas) == W


def test_parser_chosen_from_template() -> None:
    assert parser_for_template("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert parser_for_template("{% if tools %}[TOOL_CALLS]{% endif %}") == "mistral"
    assert parser_for_template("{% if tools %}<|python_tag|>{% endif %}") == "llama3_json"
    assert parser_for_template("{{ messages }}") is None
    assert parser_for_template(None) is None
