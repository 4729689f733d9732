"""/infill's prompt, laid out as llama.cpp's server lays it out (its `format_infill`).

    [bos] <|repo_name|>myproject\\n                          (where the model has FIM_REP)
          <|file_sep|>{filename}\\n{text}   per input_extra chunk (FIM_SEP; else the chunk
                                            after "\\n\\n--- snippet ---\\n\\n")
          <|file_sep|>filename\\n                          (FIM_SEP)
          <pre>{input_prefix}{prompt}<suf>{input_suffix}<mid>

Each part is encoded on its own as plain text. One difference: llama.cpp puts the extra
context before the BOS; here the BOS (models whose tokenizer adds one) comes first.
What does not fit the context, less the tokens to generate, is cut as llama.cpp cuts it: the
oldest extra context first, then the prefix from its start and the suffix from its end
(prefix : suffix room 3 : 1); the markers and `prompt` always stay.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.core.tokenizers.load import FimTokens, Tokenizer
from pagedserve.openai_compat.completions.fim import fim_prompt
from pagedserve.openai_compat.infill.protocol import InfillRequest

SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
REPO_NAME = "myproject\n"
CURRENT_FILE = "filename\n"


@dataclass(frozen=True)
class InfillPrompt:
    token_ids: list[int]
    truncated: bool
    """Some of the input was cut to fit the context."""


def extra_context(tokenizer: Tokenizer, fim: FimTokens, req: InfillRequest) -> list[int]:
    """input_extra as the ids placed before the FIM prefix."""
    encode = tokenizer.encode_plain
    ids: list[int] = []
    if fim.repo_id is not None:
        ids += [fim.repo_id, *encode(REPO_NAME)]
    for chunk in req.input_extra:
        if fim.file_sep_id is not None:
            ids += [fim.file_sep_id, *encode(chunk.filename + "\n")]
        else:
            ids += encode(SNIPPET_SEPARATOR)
        ids += encode(chunk.text)
    if fim.file_sep_id is not None:
        ids += [fim.file_sep_id, *encode(CURRENT_FILE)]
    return ids


def infill_prompt(
    tokenizer: Tokenizer, fim: FimTokens, req: InfillRequest, budget: int
) -> InfillPrompt:
    """The prompt's ids, cut to at most `budget` tokens where the input allows."""
    encode = tokenizer.encode_plain
    prefix, suffix = encode(req.input_prefix), encode(req.input_suffix)
    middle, context = encode(req.prompt), extra_context(tokenizer, fim, req)
    fixed = len(fim_prompt(tokenizer, fim, middle, []))
    room = max(budget - fixed, 0)
    cut = len(prefix) + len(suffix) > room
    if cut:
        num_suffix = min(len(suffix), room // 4)
        num_prefix = min(len(prefix), room - num_suffix)
        num_suffix = min(len(suffix), room - num_prefix)
        prefix, suffix = prefix[len(prefix) - num_prefix :], suffix[:num_suffix]
    room -= len(prefix) + len(suffix)
    if len(context) > room:
        cut, context = True, context[len(context) - room :] if room else []
    ids = fim_prompt(tokenizer, fim, [*prefix, *middle], suffix, context_ids=context)
    return InfillPrompt(ids, cut)
