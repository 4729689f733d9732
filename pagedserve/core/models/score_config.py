"""How a decoder reranker scores (task score): its template and its "no" / "yes" tokens.

Qwen3-Reranker is a causal LM asked, after a system + user template around the query and the
document, whether the document answers: the score is softmax([logit(no), logit(yes)])[1] at the
prompt's last position. vLLM serves it with `hf_overrides` naming `classifier_from_token:
["no", "yes"]`; an HF folder's config.json may say the same here, and may carry the prompt as
`score_template` ({instruction}, {query} and {document} placeholders) and `score_instruction`.
What it does not say is Qwen3-Reranker's (pooling_params.QWEN3_RERANKER_TEMPLATE).
"""

from __future__ import annotations

import json
from typing import Any

from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.pooling_params import (
    QWEN3_RERANKER_INSTRUCTION,
    QWEN3_RERANKER_TEMPLATE,
    PoolerConfig,
    ScoreConfig,
)
from pagedserve.core.tokenizers.base import Tokenizer


def resolve_scorer(resolved: ResolvedModel, tokenizer: Tokenizer) -> PoolerConfig:
    """The PoolerConfig of task score; ValueError naming the config key when the model's
    files ask for what its vocabulary lacks."""
    config: dict[str, Any] = {}
    path = resolved.path / "config.json"
    if resolved.format == "hf" and path.is_file():
        config = json.loads(path.read_text(encoding="utf-8"))
    tokens = config.get("classifier_from_token", ["no", "yes"])
    if not (
        isinstance(tokens, list) and len(tokens) == 2 and all(isinstance(t, str) for t in tokens)
    ):
        raise ValueError(
            f"{path}: classifier_from_token must be two tokens, the 'no' and the 'yes' one "
            f"(as vLLM's hf_overrides give it), got {tokens!r}"
        )
    ids = [tokenizer.token_id(token) for token in tokens]
    missing = [token for token, i in zip(tokens, ids, strict=True) if i is None]
    if missing:
        raise ValueError(
            f"task score: the tokens {missing} are not in {resolved.name}'s vocabulary (a "
            "reranker answers with one 'no' and one 'yes' token; classifier_from_token in "
            "config.json names them)"
        )
    score = ScoreConfig(
        token_ids=(int(ids[0] or 0), int(ids[1] or 0)),
        tokens=(tokens[0], tokens[1]),
        template=str(config.get("score_template", QWEN3_RERANKER_TEMPLATE)),
        instruction=str(config.get("score_instruction", QWEN3_RERANKER_INSTRUCTION)),
    )
    return PoolerConfig(pooling="last", normalize=False, score=score)
