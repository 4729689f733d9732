"""Tokenizers built from the vocabulary a GGUF file carries (llama.cpp's `tokenizer.ggml.*`).

`gpt2` vocabularies (tokens + merges, byte-level) become a `tokenizers` BPE; `llama` ones
(tokens + scores + types) become a sentencepiece ModelProto.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from pagedserve.core.gguf_reader import gguf_reader
from pagedserve.core.tokenizers.base import Tokenizer, TokenizerMeta
from pagedserve.core.tokenizers.fim import GGUF_FIM_KEYS
from pagedserve.core.tokenizers.hf import HFTokenizer, byte_alphabet

# llama.cpp token types (the same numbers as sentencepiece's piece types).
CONTROL, USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> the split regex its merges were learned with (absent: GPT-2's own).
_SPLITS = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}
# Read with GPT-2's own split. "smollm": SmolLM's tokenizer.json splits digits first, which
# differs only for whitespace runs before a digit ("  2"); transformers, the oracle, reads the
# GGUF with GPT-2's split alone, and so do we.
_GPT2_SPLIT_PRES = frozenset({"default", "gpt2", "gpt-2", "smollm"})  # gpt-2: llama.cpp's name

# Architectures whose `llama` vocabulary llama.cpp and transformers read with the `▁` prefix in
# front of every piece of text between special tokens (transformers' GGUF Phi-3 converter; for
# a "llama" file transformers prefixes only the first piece, which our tests hold it to).
_PREFIX_EVERY_CHUNK = frozenset({"phi3"})

_KEYS = (
    "model", "pre", "tokens", "scores", "token_type", "merges", "bos_token_id", "eos_token_id",
    "eot_token_id", "eom_token_id", "unknown_token_id", "add_bos_token", "add_eos_token",
    "add_space_prefix",
    *(key for keys in GGUF_FIM_KEYS.values() for key in keys if key != "eot_token_id"),
)  # fmt: skip


def read_gguf_vocab(path: Path) -> dict[str, Any]:
    """The `tokenizer.*` metadata of a GGUF file, keyed without the `tokenizer.ggml.` prefix."""
    reader = gguf_reader(path)
    out: dict[str, Any] = {}
    for key in _KEYS:
        field = reader.fields.get(f"tokenizer.ggml.{key}")
        if field is not None:
            out[key] = _field_value(field)
    arch = reader.fields.get("general.architecture")
    out["architecture"] = _field_value(arch) if arch is not None else None
    template = reader.fields.get("tokenizer.chat_template")
    out["chat_template"] = _field_value(template) if template is not None else None
    return out


def _field_value(field: Any) -> Any:
    kinds = field.types
    if kinds[0] != gguf.GGUFValueType.ARRAY:
        return field.contents()
    if kinds[-1] == gguf.GGUFValueType.STRING:
        # Reading the raw parts is much faster than contents() for 100k-token vocabularies.
        return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
    return np.concatenate([field.parts[i] for i in field.data]).tolist()


def gguf_tokenizer(path: Path) -> Tokenizer:
    vocab = read_gguf_vocab(path)
    kind = vocab.get("model")
    if kind == "gpt2":
        return _bpe_tokenizer(vocab)
    if kind == "llama":
        # Here: sentencepiece (its protobuf ModelProto: ~3 MiB resident) only for the
        # vocabularies that need it, not for the gpt2 ones (the default model's).
        from pagedserve.core.tokenizers.spm import SentencePieceTokenizer

        meta = _meta(vocab, add_bos_default=True)
        every = vocab["architecture"] in _PREFIX_EVERY_CHUNK
        return SentencePieceTokenizer(spm_model_proto(vocab), meta, prefix_every_chunk=every)
    raise ValueError(f"tokenizer.ggml.model: {kind!r} is not supported (gpt2, llama)")


def _meta(vocab: dict[str, Any], add_bos_default: bool) -> TokenizerMeta:
    tokens = vocab["tokens"]
    bos, eos = vocab.get("bos_token_id"), vocab.get("eos_token_id")
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    ends = {int(v) for k in keys if (v := vocab.get(k)) is not None}
    return TokenizerMeta(
        bos_token=tokens[bos] if bos is not None else None,
        eos_token=tokens[eos] if eos is not None else None,
        bos_token_id=bos,
        eos_token_ids=frozenset(ends),
        chat_template=vocab.get("chat_template"),
        add_bos_token=bool(vocab.get("add_bos_token", add_bos_default)) and bos is not None,
        add_eos_token=bool(vocab.get("add_eos_token", False)) and eos is not None,
        fim_token_ids=_fim_token_ids(vocab),
    )


def _fim_token_ids(vocab: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """llama.cpp's FIM ids by fim.GGUF_FIM_KEYS' names (the newest key written wins)."""
    found = {}
    for name, keys in GGUF_FIM_KEYS.items():
        value = next((vocab[k] for k in keys if vocab.get(k) is not None), None)
        if value is not None:
            found[name] = int(value)
    return tuple(found.items())


def _bpe_tokenizer(vocab: dict[str, Any]) -> Tokenizer:
    meta = _meta(vocab, add_bos_default=False)
    alphabet = byte_alphabet()
    letters = set(alphabet.values())
    spelled = {
        t if set(t) <= letters else "".join(alphabet[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(vocab["tokens"])
    }
    merges = [tuple(m.split(" ", 1)) for m in vocab.get("merges", [])]
    backend = tokenizers.Tokenizer(models.BPE(spelled, merges, fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(vocab.get("pre", "default"))
    backend.decoder = decoders.ByteLevel()
    _add_marked_tokens(backend, vocab, letters)
    bos = meta.bos_token
    if meta.add_bos_token and bos is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, meta.bos_token_id)],
        )  # fmt: skip
    return HFTokenizer(backend, meta)


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The split the merges were learned with. Another split would tokenize differently from
    the model's training, so an unknown name is refused, never read as GPT-2's."""
    split = _SPLITS.get(pre)
    if split is None and pre not in _GPT2_SPLIT_PRES:
        known = ", ".join(sorted(_GPT2_SPLIT_PRES | _SPLITS.keys()))
        raise ValueError(
            f"tokenizer.ggml.pre: {pre!r} is not a supported pre-tokenizer (supported: {known})"
        )
    if split is not None:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _add_marked_tokens(
    backend: tokenizers.Tokenizer, vocab: dict[str, Any], letters: set[str]
) -> None:
    """Control tokens match whole in text and are special; user-defined ones match whole too.
    A control token spelled outside the byte alphabet is a llama.cpp mislabel: left out."""
    tokens = vocab["tokens"]
    kinds = list(zip(tokens, _token_types(vocab), strict=True))
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, k in kinds
        if k == CONTROL and set(t) <= letters
    ]
    user = [AddedToken(t, special=False, normalized=False) for t, k in kinds if k == USER_DEFINED]
    backend.add_special_tokens(control)
    backend.add_tokens(user)


def _token_types(vocab: dict[str, Any]) -> list[int]:
    return vocab.get("token_type") or [1] * len(vocab["tokens"])  # 1: normal


def spm_model_proto(vocab: dict[str, Any]) -> bytes:
    """A sentencepiece BPE ModelProto equivalent to a GGUF `llama` vocabulary."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()  # type: ignore[attr-defined]  # no stubs for the pb2 module
    tokens, scores = vocab["tokens"], vocab.get("scores") or [0.0] * len(vocab["tokens"])
    types = _token_types(vocab)
    for token, score, kind in zip(tokens, scores, types, strict=True):
        proto.pieces.add(piece=token, score=float(score), type=int(kind))
    trainer = proto.trainer_spec
    trainer.model_type = model_pb2.TrainerSpec.BPE  # type: ignore[attr-defined]  # no stubs
    trainer.vocab_size = len(tokens)
    trainer.byte_fallback = any(k == 6 for k in types)
    trainer.unk_id = int(vocab.get("unknown_token_id", 0))
    trainer.bos_id = int(vocab.get("bos_token_id", -1))
    trainer.eos_id = int(vocab.get("eos_token_id", -1))
    trainer.pad_id = -1
    norm = proto.normalizer_spec
    norm.name = "identity"
    norm.add_dummy_prefix = bool(vocab.get("add_space_prefix", True))
    norm.remove_extra_whitespaces = False
    norm.escape_whitespaces = True
    serialized: bytes = proto.SerializeToString()
    return serialized
