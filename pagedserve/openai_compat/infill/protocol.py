"""The /infill request body, as llama.cpp's server takes it (pydantic lives here and in common/).

Unknown fields are a 400, as elsewhere; the llama.cpp fields that editors (llama.vscode,
llama.vim) send as hints are accepted and do nothing here: `cache_prompt` (the prefix cache serves every
request, on by default), `id_slot`, `samplers` (the sampler order is fixed), `n_indent`,
`t_max_prompt_ms`, `t_max_predict_ms` and `response_fields` (the whole response is sent).
"""

from __future__ import annotations

from pydantic import Field

from pagedserve.openai_compat.common.protocol import Text, _Strict

MAX_EXTRA_CHUNKS = 1024


class ExtraChunk(_Strict):
    """One piece of context from another file (llama.vscode's ring buffer of chunks)."""

    filename: Text = "tmp"
    text: Text = ""


class InfillRequest(_Strict):
    input_prefix: Text = ""
    """The code before the cursor."""
    input_suffix: Text = ""
    """The code after the cursor."""
    input_extra: list[ExtraChunk] = Field(default_factory=list, max_length=MAX_EXTRA_CHUNKS)
    """Context placed before the FIM prefix: as repository files where the model has
    `<|repo_name|>` / `<|file_sep|>`, else each chunk after a `--- snippet ---` line."""
    prompt: Text = ""
    """Text right after the prefix (llama.vscode: the cursor's line up to the cursor)."""
    model: str | None = None
    n_predict: int = Field(default=-1, ge=-1)
    """Tokens to generate; -1: until a stop or the context's end; 0: no text (the prompt is
    prefilled: it warms the prefix cache)."""
    temperature: float | None = Field(default=None, ge=0)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, gt=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = Field(default=None, ge=-1)
    """-1 (llama.cpp's default): unseeded."""
    stop: list[Text] | None = None
    ignore_eos: bool = False
    stream: bool = False
    # Editor hints, accepted and unused (the module's docstring says why).
    cache_prompt: bool | None = None
    id_slot: int | None = None
    samplers: list[str] | str | None = None
    n_indent: int | None = None
    t_max_prompt_ms: int | None = None
    t_max_predict_ms: int | None = None
    response_fields: list[str] | None = None

    def input_chars(self) -> int:
        chunks = sum(len(c.text) + len(c.filename) for c in self.input_extra)
        return len(self.input_prefix) + len(self.input_suffix) + len(self.prompt) + chunks
