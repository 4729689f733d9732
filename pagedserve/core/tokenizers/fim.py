"""Fill-in-the-middle (FIM) tokens: which ids mark a code model's prefix, suffix and middle.

Found once per tokenizer (`Tokenizer.fim`): from a GGUF's `tokenizer.ggml.fim_pre_token_id` /
`fim_suf_token_id` / `fim_mid_token_id` where llama.cpp wrote them (or its older
`prefix_token_id` / `suffix_token_id` / `middle_token_id`), else from the vocabulary's
spellings: Qwen2.5-Coder's and CodeGemma's `<|fim_prefix|>`, StarCoder's and SantaCoder's
`<fim_prefix>`, CodeLlama's `▁<PRE>` (or `<PRE>`), DeepSeek-Coder's `<｜fim▁begin｜>`. A model
with none of them has no FIM tokens (None).

The prompt is PSM (prefix, suffix, middle) in token ids, so text that spells a marker is never
read as one: `[bos] <pre> prefix <suf> suffix <mid>`, and the model writes the middle until one
of `end_ids` (its end-of-text, CodeLlama's `<EOT>`, Qwen's `<|fim_pad|>`, `<|repo_name|>`,
`<|file_sep|>`: the tokens llama.cpp also ends generation on).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

_TRIOS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
    ("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>"),  # CodeLlama (sentencepiece pieces)
    ("<PRE>", "<SUF>", "<MID>"),
    ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581end\uff5c>"),
)
"""(prefix, suffix, middle) spellings, tried in order; the first whose three exist wins."""
_PAD = ("<|fim_pad|>", "<fim_pad>")
_REPO = ("<|repo_name|>", "<repo_name>", "<reponame>")
_FILE_SEP = ("<|file_sep|>", "<file_sep>", "<|file_separator|>")
_END = ("<|endoftext|>", "\u2581<EOT>", "<EOT>")

GGUF_FIM_KEYS = {
    "pre": ("fim_pre_token_id", "prefix_token_id"),
    "suf": ("fim_suf_token_id", "suffix_token_id"),
    "mid": ("fim_mid_token_id", "middle_token_id"),
    "pad": ("fim_pad_token_id",),
    "rep": ("fim_rep_token_id",),
    "sep": ("fim_sep_token_id",),
    "eot": ("eot_token_id",),
}
"""Our name -> the `tokenizer.ggml.*` keys llama.cpp writes it under (newest first)."""


@dataclass(frozen=True)
class FimTokens:
    """The ids of a model's FIM markers (all inside the vocabulary)."""

    prefix_id: int
    suffix_id: int
    middle_id: int
    end_ids: frozenset[int] = frozenset()
    """Tokens that end a middle besides the model's EOS (generation stops on them)."""
    repo_id: int | None = None
    """`<|repo_name|>`: starts repository-level context (llama.cpp's FIM_REP)."""
    file_sep_id: int | None = None
    """`<|file_sep|>`: starts each file of that context (llama.cpp's FIM_SEP)."""

    def psm_prompt(
        self,
        prefix_ids: Sequence[int],
        suffix_ids: Sequence[int],
        *,
        bos_id: int | None = None,
        context_ids: Sequence[int] = (),
    ) -> list[int]:
        """`[bos] context <pre> prefix <suf> suffix <mid>`: the model writes the middle next."""
        head = [bos_id] if bos_id is not None else []
        return [*head, *context_ids, self.prefix_id, *prefix_ids, self.suffix_id, *suffix_ids,
                self.middle_id]  # fmt: skip


def find_fim_tokens(
    lookup: Callable[[str], int | None], vocab_size: int, gguf_ids: Mapping[str, int] | None = None
) -> FimTokens | None:
    """The FIM tokens of a vocabulary: GGUF metadata ids first (all three of pre/suf/mid),
    else the first spelling trio whose three tokens exist. `lookup`: token text -> id."""

    gguf_ids = gguf_ids or {}

    def known(token_id: int | None) -> int | None:
        return token_id if token_id is not None and 0 <= token_id < vocab_size else None

    def first(spellings: Iterable[str]) -> int | None:
        return next((i for s in spellings if (i := known(lookup(s))) is not None), None)

    trio = [known(gguf_ids.get(k)) for k in ("pre", "suf", "mid")]
    if None in trio:
        trio = next(
            (ids for t in _TRIOS if None not in (ids := [known(lookup(s)) for s in t])), trio
        )
    prefix, suffix, middle = trio
    if prefix is None or suffix is None or middle is None or len({*trio}) < 3:
        return None
    repo = known(gguf_ids.get("rep")) if "rep" in gguf_ids else first(_REPO)
    file_sep = known(gguf_ids.get("sep")) if "sep" in gguf_ids else first(_FILE_SEP)
    pad = known(gguf_ids.get("pad")) if "pad" in gguf_ids else first(_PAD)
    ends = {known(lookup(s)) for s in _END} | {known(gguf_ids.get("eot")), pad, repo, file_sep}
    ends -= {None, prefix, suffix, middle}
    return FimTokens(prefix, suffix, middle, frozenset(i for i in ends if i is not None),
                     repo_id=repo, file_sep_id=file_sep)  # fmt: skip
