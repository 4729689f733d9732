"""A GGUF token embedding kept in its blocks (models/quantized_embedding.py): its lookups give the
dense table's bits (the loader's dequantization, then the model's dtype) for every block type
the loader takes, and the default model keeps its Q8_0 table so, with the mapped file's pages
given back after loading (gguf_reader.release_mapped_pages)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from pagedserve.core.models.quantized_embedding import QuantizedEmbedding
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
    assert isinstance(embed, QuantizedEmbedding) and embed.ggml_type == Q.Q8_0
    # 34 bytes per 32 values where the float32 table took 128.
    assert embed.blocks.numel() == arch.vocab_size * arch.hidden_size // 32 * 34
    # The loader read most of the file's ~100 MB; it keeps none of it resident.
    assert mapped_rss_kib(gguf) < 4096, mapped_rss_kib(gguf)
    # ... and reads it again as if nothing happened (the cached reader's rows fault back in).
    from pagedserve.core.gguf_reader import gguf_reader

    reader = gguf_reader(gguf)
    token_embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    rows = np.asarray(token_embd.data[:3])
    want = torch.from_numpy(dequantized(rows, Q.Q8_0))
    assert torch.equal(embed(torch.arange(3)), want)
