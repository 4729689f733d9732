"""`<think>...</think>` -> reasoning_content (vLLM's deepseek_r1 / qwen3 parsers, one rule).

Chosen by `--reasoning-parser` or, with "auto", when the chat template itself writes
`</think>`. The output starts inside the thinking when the rendered prompt ends with `<think>`
(templates that open it for the model); otherwise it may open with `<think>`. Text after
`</think>` is content. Streamed: a split tag is held back until it is whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.openai_compat.chat.tool_parsers.base import held_prefix

OPEN, CLOSE = "<think>", "</think>"


def wants_reasoning(choice: str, template_source: str | None) -> bool:
    """`choice`: ServerConfig.reasoning_parser (auto, none, or a name of the <think> rule)."""
    if choice == "none":
        return False
    if choice == "auto":
        return bool(template_source) and CLOSE in (template_source or "")
    return True


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class ReasoningParser:
    """One per output choice; fed text as it streams."""

    def __init__(self, prompt_text: str) -> None:
        self._mode = "think" if prompt_text.rstrip().endswith(OPEN) else "start"
        self._held = ""
        self._after_close = False  # newlines right after </think> are not content

    def feed(self, text: str) -> ReasoningDelta:
        out = ReasoningDelta()
        if self._mode == "content":
            out.content = self._content(text)
            return out
        self._held += text
        if self._mode == "start":
            self._start()
        if self._mode == "think":
            self._think(out)
        if self._mode == "content" and self._held:
            held, self._held = self._held, ""
            out.content = self._content(held)
        return out

    def _content(self, text: str) -> str:
        if self._after_close:
            text = text.lstrip("\n")
            self._after_close = not text
        return text

    def _start(self) -> None:
        stripped = self._held.lstrip()
        if stripped.startswith(OPEN):
            self._held, self._mode = stripped[len(OPEN) :], "think"
        elif not OPEN.startswith(stripped):
            self._mode = "content"

    def _think(self, out: ReasoningDelta) -> None:
        if CLOSE in self._held:
            thought, _, rest = self._held.partition(CLOSE)
            out.reasoning += thought
            self._held, self._mode, self._after_close = rest, "content", True
            return
        keep = held_prefix(self._held, (CLOSE,))
        out.reasoning += self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]

    def finish(self) -> ReasoningDelta:
        held, self._held = self._held, ""
        if self._mode == "think":
            return ReasoningDelta(reasoning=held)
        return ReasoningDelta(content=held)
