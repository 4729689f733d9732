"""Which task a model serves, and how an embedding model pools (PoolerConfig).

An HF folder says it is an embedding model through sentence-transformers' files
(`modules.json`: Transformer, Pooling, Normalize; `1_Pooling/config.json`: the pooling mode;
`config_sentence_transformers.json`: named prompts) or through a bare-backbone architecture
(`Qwen3Model`, `*ForSequenceEmbedding`: no LM head); a GGUF file through `{arch}.pooling_type`
(llama.cpp's enum). Decoder-only embedders without sentence-transformers' files pool the last
token and normalize (Qwen3-Embedding, gte-Qwen2), as vLLM defaults.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from pagedserve.core.config import TASKS
from pagedserve.core.gguf_reader import gguf_reader
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.models.score_config import resolve_scorer
from pagedserve.core.pooling_params import PoolerConfig
from pagedserve.core.tokenizers.base import Tokenizer

ST_MODULES = "modules.json"
ST_CONFIG = "config_sentence_transformers.json"
_ST_PREFIX = "sentence_transformers."
_ST_KINDS = ("Transformer", "Pooling", "Normalize")
# sentence-transformers' pooling modes (its pooling_mode string, or the older
# pooling_mode_* booleans) -> ours; the others are refused by name.
_ST_POOLING = {"lasttoken": "last", "mean": "mean", "cls": "cls"}
_ST_LEGACY = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# llama.cpp's enum llama_pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank.
GGUF_POOLING = {1: "mean", 2: "cls", 3: "last"}
_GGUF_POOLING_NAMES = {0: "none", 4: "rank"}


def resolve_pooler(
    task: str,
    resolved: ResolvedModel,
    hidden_size: int,
    matryoshka: bool | None = None,
    tokenizer: Tokenizer | None = None,
) -> PoolerConfig | None:
    """The model's PoolerConfig when it serves embeddings (task embed, or auto and the model
    says it is an embedder) or scores (task score: needs the `tokenizer`), None when it
    generates. `matryoshka` overrides what the config declares about truncated `dimensions`."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if task == "generate":
        return None
    if task == "score":
        if tokenizer is None:
            raise ValueError("task score needs the model's tokenizer (its yes / no tokens)")
        return replace(resolve_scorer(resolved, tokenizer), dimensions=1)
    if resolved.format == "gguf":
        pooler = _gguf_pooler(resolved.path, task)
    else:
        pooler = _folder_pooler(resolved.path, task)
    if pooler is None:
        return None
    return _with_dimensions(pooler, resolved, hidden_size, matryoshka)


def _folder_pooler(folder: Path, task: str) -> PoolerConfig | None:
    config = _read_json(folder / "config.json") or {}
    modules = _read_json(folder / ST_MODULES)
    bare = any(_is_bare_backbone(a) for a in config.get("architectures") or [])
    if task == "auto" and modules is None and not bare:
        return None
    if modules is None:
        return PoolerConfig(pooling="last", normalize=True)
    if not isinstance(modules, list):
        raise ValueError(f"{folder / ST_MODULES}: expected a list of modules")
    pooling, normalize = "last", False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if not str(module.get("type", "")).startswith(_ST_PREFIX) or kind not in _ST_KINDS:
            raise ValueError(
                f"{folder / ST_MODULES}: module {module.get('type')!r} is not supported "
                f"(supported: {', '.join(_ST_KINDS)})"
            )
        if kind == "Pooling":
            pooling = _st_pooling(folder / str(module.get("path", "")) / "config.json")
        normalize = normalize or kind == "Normalize"
    st = _read_json(folder / ST_CONFIG) or {}
    prompts = {str(k): str(v) for k, v in (st.get("prompts") or {}).items()}
    return PoolerConfig(
        pooling=pooling,
        normalize=normalize,
        prompts=prompts,
        default_prompt_name=st.get("default_prompt_name") or None,
    )


def _is_bare_backbone(architecture: str) -> bool:
    """`Qwen3Model`, `Qwen2Model`, `LlamaForSequenceEmbedding`: no LM head, hidden states out."""
    return architecture.endswith(("Model", "ForSequenceEmbedding"))


def _st_pooling(path: Path) -> str:
    config = _read_json(path)
    if config is None:
        raise FileNotFoundError(f"{path}: the Pooling module's config is missing")
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in _ST_LEGACY.items() if config.get(key)]
        mode = modes if len(modes) != 1 else modes[0]
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if not isinstance(mode, str) or mode not in _ST_POOLING:
        raise ValueError(
            f"{path}: pooling mode {mode!r} is not supported (supported: {', '.join(_ST_POOLING)})"
        )
    pooling = _ST_POOLING[mode]
    if config.get("include_prompt") is False and pooling != "last":
        raise ValueError(f"{path}: include_prompt false is not supported with {mode} pooling")
    return pooling


def _gguf_pooler(path: Path, task: str) -> PoolerConfig | None:
    reader = gguf_reader(path)
    arch = _gguf_string(reader.fields.get("general.architecture"))
    field = reader.fields.get(f"{arch}.pooling_type")
    if field is None:
        return PoolerConfig(pooling="last", normalize=True) if task == "embed" else None
    value = int(field.parts[field.data[0]][0])
    if value == 0 and task == "auto":
        return None
    if value not in GGUF_POOLING:
        name = _GGUF_POOLING_NAMES.get(value, str(value))
        raise ValueError(
            f"GGUF key '{arch}.pooling_type' = {value} ({name}) is not supported "
            f"(supported: {', '.join(f'{k} ({v})' for k, v in GGUF_POOLING.items())})"
        )
    # llama.cpp's server L2-normalizes /v1/embeddings by default; so do we.
    return PoolerConfig(pooling=GGUF_POOLING[value], normalize=True)


def _gguf_string(field: Any) -> str:
    return "" if field is None else bytes(field.parts[field.data[0]]).decode("utf-8")


def _with_dimensions(
    pooler: PoolerConfig, resolved: ResolvedModel, hidden_size: int, matryoshka: bool | None
) -> PoolerConfig:
    """Matryoshka support as config.json declares it (vLLM's `is_matryoshka` /
    `matryoshka_dimensions`), unless `matryoshka` says otherwise."""
    config: dict[str, Any] = {}
    if resolved.format == "hf":
        config = _read_json(resolved.path / "config.json") or {}
    listed = config.get("matryoshka_dimensions")
    declared: tuple[int, ...] | None = None
    if listed:
        declared = tuple(int(d) for d in listed)
    elif config.get("is_matryoshka"):
        declared = ()
    if matryoshka is False:
        declared = None
    elif matryoshka and declared is None:
        declared = ()
    return replace(pooler, dimensions=hidden_size, matryoshka_dimensions=declared)


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)
