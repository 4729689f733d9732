"""BPE tokenizers run by the `tokenizers` library (tokenizer.json, or built from a GGUF)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property, lru_cache

import tokenizers

from pagedserve.core.tokenizers.base import Tokenizer, TokenizerMeta


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level spelling: every byte as one printable character. Printable Latin-1
    bytes stand for themselves; the rest are shifted past 255 in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1)]
    kept += range(ord("\xae"), ord("\xff") + 1)
    spelling = {b: chr(b) for b in kept}
    shifted = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + shifted)
            shifted += 1
    return spelling


@lru_cache(maxsize=1)
def _char_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_alphabet().items()}


def _metaspace_bytes(token: str) -> bytes:
    """A sentencepiece-style token: `<0xNN>` is one byte, `▁` is a space."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace("\u2581", " ").encode("utf-8")


_GIL_FREE_CHARS = 16_384  # below this, encode() is quicker than the batch path


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer`; its post-processor decides what add_special_tokens adds."""

    def __init__(self, backend: tokenizers.Tokenizer, meta: TokenizerMeta) -> None:
        super().__init__(meta, backend.get_vocab_size(with_added_tokens=True))
        self._backend = backend
        added = backend.get_added_tokens_decoder()
        self._added = {i: t.content for i, t in added.items()}
        self._special = frozenset(i for i, t in added.items() if t.special)
        # Byte-level vocabularies (GPT-2, Llama 3, SmolLM) spell bytes as characters;
        # the others (converted sentencepiece) use `▁` and <0xNN> byte fallback.
        self._byte_level = "ByteLevel" in repr(backend.decoder)
        probe = backend.encode("a", add_special_tokens=True).ids
        self.add_bos_token = bool(probe) and probe[0] == meta.bos_token_id and len(probe) > 1

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) < _GIL_FREE_CHARS:
            return self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        # encode() holds the GIL for the whole text; encode_batch() lets it go, so a server
        # thread tokenizing megabytes does not stall the event loop (same ids either way).
        [encoding] = self._backend.encode_batch([text], add_special_tokens=add_special_tokens)
        return encoding.ids

    def encode_plain(self, text: str) -> list[int]:
        [encoding] = self._plain_backend.encode_batch([text], add_special_tokens=False)
        return encoding.ids

    @cached_property
    def _plain_backend(self) -> tokenizers.Tokenizer:
        """A copy that reads special-token text as text (built on first use: FIM prompts)."""
        plain = tokenizers.Tokenizer.from_str(self._backend.to_str())
        plain.encode_special_tokens = True
        return plain

    def token_id(self, text: str) -> int | None:
        return self._backend.token_to_id(text)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        self._check_id(token_id)
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        token = self._backend.id_to_token(token_id)
        if token is None:  # a hole in the vocabulary
            return b""
        if not self._byte_level:
            return _metaspace_bytes(token)
        table = _char_to_byte()
        # A character outside the byte alphabet (a mislabelled GGUF token) stands for itself.
        return b"".join(bytes([table[c]]) if c in table else c.encode("utf-8") for c in token)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special
