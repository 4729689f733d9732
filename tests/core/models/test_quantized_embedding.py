"""A GGUF token embedding kept in its blocks (models/quantized_embedding.py): its lookups give the
dense table's bits (the loader's dequantization, then the model's dtype) for every block type
the loader takes; a Q8_0 embedding tied to a quantized LM head reads the head's tiles (the same
bits); the default model keeps its Q8_0 table so, in one copy with its head, with the mapped
file's pages given back after loading (gguf_reader.release_mapped_pages)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from pagedserve.core.models.quantized_embedding import QuantizedEmbedding, TiedQ8Embedding
from pagedserve.core.ops.linear_quant import pack_quant_weight
from tests.quant_blocks import dequantized, gguf_rows

VOCAB, HIDDEN = 300, 256


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lookups_give_the_dense_tables_bits(qtype: Q, dtype: torch.dtype) -> None:
    rows = gguf_rows(qtype, VOCAB, HIDDEN, seed=int(qtype))
    table = torch.from_numpy(dequantized(rows, qtype)).to(dtype)  # what the loader builds
    embed = QuantizedEmbedding(torch.from_numpy(rows.copy()), int(qtype), HIDDEN, dtype)
    ids = torch.tensor([[0, 17, 299, 17], [5, 5, 120, 64]])
    got = embed(ids)
    assert got.dtype == dtype and got.shape == (2, 4, HIDDEN)
    assert torch.equal(got, nn_lookup(table, ids))
    assert torch.equal(embed(torch.tensor([3])), table[3:4])  # one decode token
    with pytest.raises(IndexError):
        embed(torch.tensor([VOCAB]))


@pytest.mark.parametrize(("vocab", "hidden"), [(VOCAB, HIDDEN), (32, 32), (33, 576)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tied_lookups_read_the_heads_tiles_bit_for_bit(
    vocab: int, hidden: int, dtype: torch.dtype
) -> None:
    """Every token's row, sign bits included, as the loader's dense table (vocab 33: a last
    tile with one column of 32)."""
    rows = gguf_rows(Q.Q8_0, vocab, hidden, seed=vocab)
    rows[1, :2] = np.zeros(1, np.float16).view(np.uint8)  # a block with d = 0 (all-zero weights)
    table = torch.from_numpy(dequantized(rows, Q.Q8_0)).to(dtype)
    addresses = rows.ctypes.data + np.arange(vocab, dtype=np.int64) * rows.strides[0]
    head = pack_quant_weight(int(Q.Q8_0), addresses, hidden)  # the LM head's tiles
    embed = TiedQ8Embedding(head, vocab, hidden, dtype)
    got = embed(torch.arange(vocab))
    assert got.dtype == dtype and torch.equal(bits(got), bits(table))
    ids = torch.tensor([[0, vocab - 1], [1, 0]])
    assert torch.equal(embed(ids), nn_lookup(table, ids))
    assert embed(torch.tensor([], dtype=torch.int64)).shape == (0, hidden)
    with pytest.raises(IndexError):
        embed(torch.tensor([vocab]))
    with pytest.raises(ValueError, match="Q8_0 tiles"):
        TiedQ8Embedding(head[:-1], vocab, hidden, dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def nn_lookup(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.embedding(ids, table)


def test_blocks_must_be_byte_rows() -> None:
    with pytest.raises(ValueError, match="uint8"):
        QuantizedEmbedding(torch.zeros(4, 34, dtype=torch.int8), int(Q.Q8_0), 32, torch.float32)


def mapped_rss_kib(path: Path) -> int:
    """This process's resident KiB of the mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = len(fields) >= 6 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def test_default_model_keeps_its_embedding_quantized_and_lets_the_file_go() -> None:
    from pagedserve.core.attention.reference import TorchReferenceBackend
    from pagedserve.core.models import load_model
    from pagedserve.core.models.resolve import DEFAULT_CACHE_DIR, fetch_default_model, resolve_model

    gguf = fetch_default_model(DEFAULT_CACHE_DIR.expanduser()).resolve()
    model, arch = load_model(resolve_model(str(gguf)), dtype=torch.float32,
                             device=torch.device("cpu"), attention=TorchReferenceBackend(),
                             progress=False, quantization="auto")  # fmt: skip
    embed = model.embed_tokens
    # The tied head's Q8_0 tiles, one copy for both: 36 bytes per 32 values where the float32
    # table took 128 (and a copy of the GGUF's blocks 34 more).
    assert isinstance(embed, TiedQ8Embedding)
    [segment] = model.lm_head.segments
    assert embed.packed.data_ptr() == segment.packed.data_ptr()
    assert embed.packed.numel() == arch.vocab_size * arch.hidden_size // 32 * 36
    # The loader read most of the file's ~100 MB; it keeps none of it resident.
    assert mapped_rss_kib(gguf) < 4096, mapped_rss_kib(gguf)
    # ... and reads it again as if nothing happened (the cached reader's rows fault back in).
    from pagedserve.core.gguf_reader import gguf_reader

    reader = gguf_reader(gguf)
    token_embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    rows = np.asarray(token_embd.data)
    want = torch.from_numpy(dequantized(rows, Q.Q8_0))
    assert torch.equal(bits(embed(torch.arange(arch.vocab_size))), bits(want))
