"""The <think> reasoning parser, whole and streamed cut at every character."""

from __future__ import annotations

import pytest

from pagedserve.openai_compat.chat.reasoning import ReasoningParser, wants_reasoning

CASES = [
    ("", "<think>\nLet me think. 2+2 is 4.\n</think>\n\nThe answer is 4.",
     "\nLet me think. 2+2 is 4.\n", "The answer is 4."),
    ("<|im_start|>assistant\n<think>\n", "It is 4 </thin k>.</think>Four.",
     "It is 4 </thin k>.", "Four."),
    ("", "No thinking here, <think> later is text.", "", "No thinking here, <think> later is text."),
    ("", "<think>cut off by max_tokens", "cut off by max_tokens", ""),
    ("", "  <thin", "", "  <thin"),
]  # fmt: skip


def run(prompt: str, pieces: list[str]) -> tuple[str, str]:
    parser = ReasoningParser(prompt)
    reasoning, content = "", ""
    for piece in pieces:
        d = parser.feed(piece)
        reasoning, content = reasoning + d.reasoning, content + d.content
    d = parser.finish()
    return reasoning + d.reasoning, content + d.content


@pytest.mark.parametrize("prompt,text,reasoning,content", CASES)
def test_whole_and_every_cut(prompt: str, text: str, reasoning: str, content: str) -> None:
    assert run(prompt, [text]) == (reasoning, content)
    for cut in range(len(text) + 1):
        assert run(prompt, [text[:cut], text[cut:]]) == (reasoning, content), cut
    assert run(prompt, list(text)) == (reasoning, content)


def test_auto_detection_from_template() -> None:
    assert wants_reasoning("auto", "{{ '<think>' }}...{{ '</think>' }}")
    assert not wants_reasoning("auto", "{{ messages }}")
    assert not wants_reasoning("none", "</think>")
    assert wants_reasoning("deepseek_r1", None)
