"""Fill-in-the-middle tokens (core/tokenizers/fim.py): each spelling found from a tiny trained
vocabulary (Qwen2.5-Coder's and StarCoder's in tokenizer.json, CodeLlama's `▁<PRE>` pieces in a
sentencepiece tokenizer.model, a GGUF's fim_*_token_id metadata, which wins over spellings);
none on a vocabulary without them; the PSM prompt in ids, with marker text in the user's code
kept as text."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from bench.common.tiny_tokenizers import BPE_SPECIAL_TOKENS, train_tiny_bpe, train_tiny_spm
from pagedserve.core.tokenizers.fim import FimTokens
from pagedserve.core.tokenizers.load import Tokenizer, load_tokenizer

QWEN_FIM = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
            "<|repo_name|>", "<|file_sep|>"]  # fmt: skip
STARCODER_FIM = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"]


def write_bpe_folder(folder: Path, extra_specials: list[str]) -> Path:
    """A tokenizer.json folder whose special tokens are ChatML's then `extra_specials`."""
    folder.mkdir(parents=True)
    train_tiny_bpe(special_tokens=[*BPE_SPECIAL_TOKENS, *extra_specials]).save(
        str(folder / "tokenizer.json")
    )
    config = {"eos_token": "<|endoftext|>", "add_bos_token": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def ids(tokenizer: Tokenizer, *texts: str) -> list[int | None]:
    return [tokenizer.token_id(t) for t in texts]


def test_qwen_spelling(tmp_path: Path) -> None:
    tok = load_tokenizer(write_bpe_folder(tmp_path / "qwen", QWEN_FIM))
    pre, mid, suf, pad, repo, sep, eot = ids(tok, *QWEN_FIM, "<|endoftext|>")
    assert tok.fim == FimTokens(pre, suf, mid, frozenset({pad, repo, sep, eot}), repo, sep)  # type: ignore[arg-type]


def test_starcoder_spelling(tmp_path: Path) -> None:
    tok = load_tokenizer(write_bpe_folder(tmp_path / "starcoder", STARCODER_FIM))
    pre, mid, suf, pad, eot = ids(tok, *STARCODER_FIM, "<|endoftext|>")
    assert tok.fim == FimTokens(pre, suf, mid, frozenset({pad, eot}))  # type: ignore[arg-type]


def test_codellama_pieces(tmp_path: Path) -> None:
    """CodeLlama's sentencepiece vocabulary spells them `▁<PRE>` `▁<SUF>` `▁<MID>` `▁<EOT>`."""
    proto = model_pb2.ModelProto()
    proto.ParseFromString(train_tiny_spm())
    for piece in ("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>", "\u2581<EOT>"):
        proto.pieces.add(piece=piece, score=0.0, type=model_pb2.ModelProto.SentencePiece.CONTROL)
    folder = tmp_path / "codellama"
    folder.mkdir()
    (folder / "tokenizer.model").write_bytes(proto.SerializeToString())
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(folder)
    n = len(proto.pieces)
    assert tok.fim == FimTokens(n - 4, n - 3, n - 2, frozenset({n - 1}))


def test_no_fim_tokens(tmp_path: Path) -> None:
    """SmolLM-style `<repo_name>` / `<file_sep>` alone are not FIM."""
    tok = load_tokenizer(write_bpe_folder(tmp_path / "plain", ["<repo_name>", "<file_sep>"]))
    assert tok.fim is None


def write_vocab_gguf(path: Path, fim_ids: dict[str, int] | None) -> list[str]:
    """A GGUF holding only a `gpt2` vocabulary (Qwen's FIM specials among its tokens) and, when
    given, llama.cpp's tokenizer.ggml.fim_*_token_id keys."""
    specials = [*BPE_SPECIAL_TOKENS, *QWEN_FIM]
    tokenizer = train_tiny_bpe(special_tokens=specials)
    vocab = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(vocab)
    writer.add_token_types([3 if t in specials else 1 for t in vocab])
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(m) for m in merges])
    writer.add_eos_token_id(0)
    for name, token_id in (fim_ids or {}).items():
        writer.add_uint32(f"tokenizer.ggml.{name}", token_id)
    writer.add_tensor("token_embd.weight", np.zeros((len(vocab), 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return vocab


def test_gguf_metadata_wins_over_spellings(tmp_path: Path) -> None:
    """llama.cpp's keys name the ids (here deliberately not the `<|fim_*|>` spellings' ones)."""
    keys = {"fim_pre_token_id": 10, "fim_suf_token_id": 11, "fim_mid_token_id": 12,
            "fim_sep_token_id": 13, "fim_rep_token_id": 14, "fim_pad_token_id": 15}  # fmt: skip
    write_vocab_gguf(tmp_path / "meta.gguf", keys)
    tok = load_tokenizer(tmp_path / "meta.gguf")
    assert tok.fim == FimTokens(10, 11, 12, frozenset({0, 13, 14, 15}), 14, 13)


def test_gguf_without_metadata_reads_spellings(tmp_path: Path) -> None:
    vocab = write_vocab_gguf(tmp_path / "plain.gguf", None)
    tok = load_tokenizer(tmp_path / "plain.gguf")
    assert tok.fim is not None
    assert (tok.fim.prefix_id, tok.fim.middle_id) == (3, 4)  # the trained order of QWEN_FIM
    assert vocab[tok.fim.suffix_id] == "<|fim_suffix|>"


@pytest.mark.parametrize("kind", ["bpe", "spm"])
def test_psm_prompt_keeps_marker_text_as_text(tmp_path: Path, kind: str) -> None:
    if kind == "bpe":
        tok = load_tokenizer(write_bpe_folder(tmp_path / "qwen", QWEN_FIM))
        marker = "<|fim_prefix|>"
    else:
        test_codellama_pieces(tmp_path)
        tok = load_tokenizer(tmp_path / "codellama")
        marker = "</s>"
    fim = tok.fim
    assert fim is not None
    prefix, suffix = f"def f(x):\n    {marker}", "    return y\n"
    plain = tok.encode_plain(prefix)
    assert fim.prefix_id not in plain and tok.decode(plain, skip_special_tokens=False) == prefix
    assert tok.encode(prefix, add_special_tokens=False) != plain  # encode reads the marker
    prompt = fim.psm_prompt(plain, tok.encode_plain(suffix), bos_id=1)
    assert prompt == [1, fim.prefix_id, *plain, fim.suffix_id, *tok.encode_plain(suffix),
                      fim.middle_id]  # fmt: skip
