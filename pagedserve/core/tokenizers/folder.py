"""Tokenizers from an HF model folder: tokenizer.json or tokenizer.model, tokenizer_config.json,
generation_config.json and (newer folders) chat_template.jinja."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, processors

from pagedserve.core.tokenizers.base import Tokenizer, TokenizerMeta
from pagedserve.core.tokenizers.hf import HFTokenizer

_NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "pad_token")


def folder_tokenizer(folder: Path) -> Tokenizer:
    config = _read_json(folder / "tokenizer_config.json")
    generation = _read_json(folder / "generation_config.json")
    template = folder_chat_template(folder, config)
    if (folder / "tokenizer.json").is_file():
        backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        _apply_config(backend, config)
        meta = _meta(config, generation, template, backend.token_to_id, add_bos_default=False)
        return HFTokenizer(backend, meta)
    if (folder / "tokenizer.model").is_file():
        # Here: sentencepiece (its protobuf ModelProto: ~3 MiB resident) only for the models
        # that need it.
        from pagedserve.core.tokenizers.spm import SentencePieceTokenizer

        proto = (folder / "tokenizer.model").read_bytes()
        probe = SentencePieceTokenizer(proto, TokenizerMeta())
        meta = _meta(config, generation, template, probe.piece_id, add_bos_default=True)
        return SentencePieceTokenizer(proto, meta)
    raise ValueError(f"model: {folder} has neither tokenizer.json nor tokenizer.model")


def folder_chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is None and (folder / "chat_template.json").is_file():
        template = _read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one serves chat
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return named.get("default")
    return template if isinstance(template, str) else None


def _apply_config(backend: tokenizers.Tokenizer, config: dict[str, Any]) -> None:
    """What transformers does on load: named special tokens become special added tokens, and
    explicit add_bos_token / add_eos_token (or no post-processor) rebuild the post-processor."""
    named = [_token_text(config.get(k)) for k in _NAMED_SPECIALS]
    extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
    if isinstance(extra, dict):  # transformers 5 names them (Gemma 3's boi_token: ...)
        extra = list(extra.values())
    names = [t for t in [*named, *map(_token_text, extra)] if t]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in names])
    explicit = "add_bos_token" in config or "add_eos_token" in config
    if not explicit and backend.post_processor is not None:
        return
    bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    parts = []
    if config.get("add_bos_token") and bos:
        parts.append((bos, backend.token_to_id(bos)))
    single = " ".join([*(f"{t}:0" for t, _ in parts), "$A:0"])
    if config.get("add_eos_token") and eos:
        single += f" {eos}:0"
        parts.append((eos, backend.token_to_id(eos)))
    pair = single + " " + single.replace(":0", ":1").replace("$A", "$B")
    backend.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=list(dict(parts).items())
    )


def _meta(
    config: dict[str, Any],
    generation: dict[str, Any],
    template: str | None,
    lookup: Callable[[str], int | None],
    add_bos_default: bool,
) -> TokenizerMeta:
    bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    bos_id = lookup(bos) if bos else None
    ends = {lookup(eos)} if eos else set()
    listed = generation.get("eos_token_id")
    ends.update(listed if isinstance(listed, list) else [listed])
    return TokenizerMeta(
        bos_token=bos,
        eos_token=eos,
        bos_token_id=bos_id,
        eos_token_ids=frozenset(i for i in ends if isinstance(i, int)),
        chat_template=template,
        add_bos_token=bool(config.get("add_bos_token", add_bos_default)) and bos_id is not None,
        add_eos_token=bool(config.get("add_eos_token", False)),
    )


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # older configs: {"content": "<s>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data
