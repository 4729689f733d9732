"""SentencePiece tokenizers (tokenizer.model, or a ModelProto built from a GGUF `llama` vocab).

Encoding follows transformers' LlamaTokenizer, the oracle: control and unknown pieces written in
the text become their ids, the `▁` prefix goes only in front of the first piece of text (and not
when that text already starts with a space), and decoding drops one leading space. With
prefix_every_chunk (Phi-3's GGUF vocabulary, as llama.cpp and transformers read it) the prefix
goes in front of every piece of text between special tokens, leading space or not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from pagedserve.core.tokenizers.base import Tokenizer, TokenizerMeta

# sentencepiece's generated protobuf module ships no type stubs: its attributes are unknown to mypy.
_Piece = model_pb2.ModelProto.SentencePiece  # type: ignore[attr-defined]


class _PieceFields(Protocol):
    """The fields of a ModelProto.SentencePiece read here."""

    piece: str
    type: int


class SentencePieceTokenizer(Tokenizer):
    def __init__(
        self, model_proto: bytes, meta: TokenizerMeta, prefix_every_chunk: bool = False
    ) -> None:
        proto = model_pb2.ModelProto()  # type: ignore[attr-defined]  # no stubs (above)
        proto.ParseFromString(model_proto)
        super().__init__(meta, len(proto.pieces))
        self._add_eos_token = meta.add_eos_token
        self._add_prefix = proto.normalizer_spec.add_dummy_prefix
        self._prefix_every_chunk = prefix_every_chunk
        self._with_prefix = spm.SentencePieceProcessor(model_proto=model_proto)
        proto.normalizer_spec.add_dummy_prefix = False
        self._without_prefix = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
        special = {_Piece.CONTROL, _Piece.UNKNOWN}
        self._special = frozenset(i for i, p in enumerate(proto.pieces) if p.type in special)
        self._bytes = [_piece_bytes(p) for p in proto.pieces]
        by_text = {proto.pieces[i].piece: i for i in sorted(self._special, reverse=True)}
        self._special_by_text = by_text
        # Longest first, so that a special token containing another one wins.
        names = sorted((t for t in by_text if t), key=len, reverse=True)
        self._special_re = re.compile("|".join(map(re.escape, names))) if names else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = []
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids.append(self.bos_token_id)
        for start, piece in self._split_special(text):
            if piece in self._special_by_text:
                ids.append(self._special_by_text[piece])
                continue
            first = self._prefix_every_chunk or (
                start == 0 and not piece.startswith((" ", "\u2581"))
            )
            processor = self._with_prefix if first else self._without_prefix
            ids.extend(processor.encode(piece))
        if add_special_tokens and self._add_eos_token and self.eos_token_ids:
            ids.append(min(self.eos_token_ids))
        return ids

    def encode_plain(self, text: str) -> list[int]:
        # One chunk, never split at special-token text (sentencepiece itself reads none).
        first = self._prefix_every_chunk or not text.startswith((" ", "\u2581"))
        return (self._with_prefix if first else self._without_prefix).encode(text) if text else []

    def token_id(self, text: str) -> int | None:
        return self.piece_id(text)

    def _split_special(self, text: str) -> list[tuple[int, str]]:
        """(offset, text) chunks of `text`: each special token alone, plain text between them.
        A plain chunk never contains a whole special token, so the text tells them apart."""
        if self._special_re is None:
            return [(0, text)] if text else []
        chunks: list[tuple[int, str]] = []
        pos = 0
        for match in self._special_re.finditer(text):
            if match.start() > pos:
                chunks.append((pos, text[pos : match.start()]))
            chunks.append((match.start(), match.group()))
            pos = match.end()
        if pos < len(text):
            chunks.append((pos, text[pos:]))
        return chunks

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        table, special = self._bytes, self._special
        if skip_special_tokens:
            raw = b"".join([table[i] for i in token_ids if i not in special])
        else:
            raw = b"".join([table[i] for i in token_ids])
        # Invalid UTF-8 becomes U+FFFD per maximal subpart, so a decode of a longer sequence
        # always extends the decode of its prefix (the incremental detokenizer relies on it).
        text = raw.decode("utf-8", "replace")
        if self._add_prefix and text.startswith(" "):
            text = text[1:]
        return text

    def piece_id(self, piece: str) -> int | None:
        """The id of a piece spelled exactly `piece`, or None."""
        token_id = self._with_prefix.piece_to_id(piece)
        return token_id if self._with_prefix.id_to_piece(token_id) == piece else None

    def token_bytes(self, token_id: int) -> bytes:
        self._check_id(token_id)
        return self._bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special


def _piece_bytes(piece: _PieceFields) -> bytes:
    if piece.type == _Piece.BYTE:
        return bytes([int(piece.piece[3:5], 16)])
    if piece.type in (_Piece.CONTROL, _Piece.UNKNOWN):
        return piece.piece.encode("utf-8")
    return piece.piece.replace("\u2581", " ").encode("utf-8")
