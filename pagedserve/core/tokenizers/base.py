"""The tokenizer interface every implementation follows."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from pagedserve.core.tokenizers.fim import FimTokens, find_fim_tokens


@dataclass(frozen=True)
class TokenizerMeta:
    """What a model folder or GGUF says about its special tokens and template."""

    bos_token: str | None = None
    eos_token: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: frozenset[int] = frozenset()
    chat_template: str | None = None
    add_bos_token: bool = False
    add_eos_token: bool = False
    fim_token_ids: tuple[tuple[str, int], ...] = ()
    """A GGUF's FIM ids by fim.GGUF_FIM_KEYS' names ("pre", "suf", "mid", ...), as written."""


class Tokenizer(ABC):
    """Text <-> token ids, token for token what transformers gives for the same files."""

    vocab_size: int
    eos_token_ids: frozenset[int]
    bos_token_id: int | None
    bos_token: str | None
    eos_token: str | None
    chat_template: str | None
    add_bos_token: bool

    def __init__(self, meta: TokenizerMeta, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = meta.eos_token_ids
        self.bos_token_id = meta.bos_token_id
        self.bos_token = meta.bos_token
        self.eos_token = meta.eos_token
        self.chat_template = meta.chat_template
        self.add_bos_token = meta.add_bos_token
        self._fim_token_ids = dict(meta.fim_token_ids)

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    @abstractmethod
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def encode_plain(self, text: str) -> list[int]:
        """`text` as plain text: no special tokens added, and none read from the text (a
        user's code that spells `<|fim_prefix|>` stays those characters)."""
        return self.encode(text, add_special_tokens=False)

    def token_id(self, text: str) -> int | None:
        """The id of the vocabulary token spelled exactly `text`, or None."""
        return None

    @cached_property
    def fim(self) -> FimTokens | None:
        """The model's fill-in-the-middle tokens, or None (load_tokenizer finds them once)."""
        return find_fim_tokens(self.token_id, self.vocab_size, self._fim_token_ids)

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for (a byte-fallback token is one byte)."""

    @abstractmethod
    def is_special(self, token_id: int) -> bool: ...

    def token_str(self, token_id: int) -> str:
        """Printable form for logprobs: the token's text, or `bytes:\\xNN..` (as OpenAI writes
        it) when the token is only part of a UTF-8 character."""
        raw = self.token_bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(
                f"token_id: {token_id} is outside the vocabulary (0..{self.vocab_size - 1})"
            )
