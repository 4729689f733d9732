"""Logprobs in OpenAI's two shapes: chat (`content` with `bytes`) and completions (parallel lists)."""

from __future__ import annotations

from typing import Any

from pagedserve.core.outputs import TokenLogprob


def chat_logprobs(tokenizer: Any, items: list[TokenLogprob], top_k: int) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        return {
            "token": tokenizer.token_str(token_id),
            "logprob": logprob,
            "bytes": list(tokenizer.token_bytes(token_id)),
        }

    content = []
    for item in items:
        head = entry(item.token_id, item.logprob)
        head["top_logprobs"] = [entry(t, lp) for t, lp in item.top[:top_k]]
        content.append(head)
    return {"content": content, "refusal": None}


class CompletionLogprobs:
    """Builds the completions `logprobs` object; keeps the text offset across stream chunks."""

    def __init__(self, tokenizer: Any, top_k: int, text_offset: int = 0) -> None:
        self.tokenizer = tokenizer
        self.top_k = top_k
        self.offset = text_offset

    def build(self, token_ids: list[int], items: list[TokenLogprob | None]) -> dict[str, Any]:
        """`items[i]` is the logprob of `token_ids[i]`, None where there is none (token 0)."""
        out: dict[str, Any] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        token_str = self.tokenizer.token_str
        for token_id, item in zip(token_ids, items, strict=True):
            text = token_str(token_id)
            out["tokens"].append(text)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            if item is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(item.logprob)
            top = {token_str(t): lp for t, lp in item.top[: self.top_k]}
            top.setdefault(text, item.logprob)
            out["top_logprobs"].append(top)
        return out


def merge_completion_logprobs(first: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        first[key].extend(later[key])
    return first
