"""Tokenizers: load one from a GGUF file or an HF model folder.

    tokenizer = load_tokenizer(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))
    ids = tokenizer.encode("Hello")          # token for token what transformers gives

Implementations live in `pagedserve.core.tokenizers`: BPE through `tokenizers`, SentencePiece
through `sentencepiece`.
"""

from __future__ import annotations

from pathlib import Path

from pagedserve.core.tokenizers.base import Tokenizer, TokenizerMeta
from pagedserve.core.tokenizers.fim import FimTokens
from pagedserve.core.tokenizers.folder import folder_tokenizer
from pagedserve.core.tokenizers.gguf_vocab import gguf_tokenizer


def load_tokenizer(path: Path) -> Tokenizer:
    """`path`: a .gguf file, or a folder with tokenizer.json or tokenizer.model (a folder holding
    exactly one .gguf and no tokenizer files is read through that GGUF)."""
    tokenizer = _load(Path(path))
    _ = tokenizer.fim  # found once, here
    return tokenizer


def _load(path: Path) -> Tokenizer:
    if path.is_file() and path.suffix == ".gguf":
        return gguf_tokenizer(path)
    if path.is_dir():
        has_own = (path / "tokenizer.json").is_file() or (path / "tokenizer.model").is_file()
        ggufs = sorted(path.glob("*.gguf"))
        if not has_own and len(ggufs) == 1:
            return gguf_tokenizer(ggufs[0])
        return folder_tokenizer(path)
    raise ValueError(f"model: {path} is neither a .gguf file nor a model folder")


__all__ = ["FimTokens", "Tokenizer", "TokenizerMeta", "load_tokenizer"]
