"""The KV layout agreement, the backend registry, the native backend and bad-input errors."""

from __future__ import annotations

import pytest
import torch

from bench.common.attention_batches import make_batch
from pagedserve.core.attention import ops
from pagedserve.core.attention.base import KV_CACHE_DIMS
from pagedserve.core.attention.native import NativeAttentionBackend
from pagedserve.core.attention.reference import TorchReferenceBackend
from pagedserve.core.attention.registry import get_attention_backend
from pagedserve.core.ops import native


def test_kv_layout_is_defined_once() -> None:
    assert tuple(native.core.KV_CACHE_DIMS) == KV_CACHE_DIMS


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("auto", NativeAttentionBackend),
        ("native", NativeAttentionBackend),
        ("torch", TorchReferenceBackend),
    ],
)
def test_registry(name: str, kind: type) -> None:
    assert type(get_attention_backend(name)) is kind


def test_registry_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="attention_backend"):
        get_attention_backend("flash")


def test_native_backend_matches_torch_backend() -> None:
    b = make_batch([4, 1], [9, 30], num_kv_heads=3, group=3, dtype=torch.bfloat16)
    cache = b.kv_cache.clone()
    args = (b.query, b.key, b.value)
    got = get_attention_backend("native").forward(*args, b.kv_cache, b.meta, b.scale)
    want = get_attention_backend("torch").forward(*args, cache, b.meta, b.scale)
    assert torch.equal(b.kv_cache, cache)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def attention_call(b, **changes) -> None:
    m = b.meta
    kw = dict(
        out=torch.empty_like(b.query),
        query=b.query,
        kv_cache=b.kv_cache,
        page_table=m.page_table,
        seq_lens=m.seq_lens,
        query_start_loc=m.query_start_loc,
        max_query_len=m.max_query_len,
        max_seq_len=m.max_seq_len,
        scale=b.scale,
    )
    kw.update(changes)
    ops.paged_attention(**kw)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda b: {"page_table": b.meta.page_table.long()}, "page_table must be torch.int32"),
        (lambda b: {"seq_lens": b.meta.seq_lens[:1]}, "seq_lens must have shape"),
        (lambda b: {"query": b.query[:, :3]}, "multiple of kv_cache heads"),
        (lambda b: {"query": b.query.double()}, "query dtype"),
        (lambda b: {"kv_cache": b.kv_cache.double()}, "not supported on cpu"),
        (lambda b: {"kv_cache": b.kv_cache.transpose(3, 4)}, "kv_cache must be contiguous"),
        (lambda b: {"out": torch.empty_like(b.query)[:1]}, "out shape"),
        (lambda b: {"max_seq_len": 5}, "max_seq_len"),
        (lambda b: {"seq_lens": torch.tensor([1, 30], dtype=torch.int32)}, "seq_lens"),
        (lambda b: {"page_table": b.meta.page_table + 100}, "page id out of range"),
        (lambda b: {"scale": float("nan")}, "scale must be finite"),
    ],
)
def test_bad_attention_inputs_raise_value_error(change, match: str) -> None:
    b = make_batch([4, 1], [9, 30], group=2)
    with pytest.raises(ValueError, match=match):
        attention_call(b, **change(b))


def test_bad_cache_write_inputs_raise_value_error() -> None:
    b = make_batch([4, 1], [9, 30])
    with pytest.raises(ValueError, match="slot_mapping must be torch.int64"):
        ops.reshape_and_cache(b.key, b.value, b.kv_cache, b.meta.slot_mapping.int())
    with pytest.raises(ValueError, match="slot out of range"):
        ops.reshape_and_cache(b.key, b.value, b.kv_cache, b.meta.slot_mapping + 10_000)
    with pytest.raises(ValueError, match="value has 1 heads"):
        ops.reshape_and_cache(b.key, b.value[:, :1], b.kv_cache, b.meta.slot_mapping)


def test_native_backend_traces_under_torch_compile() -> None:
    b = make_batch([4, 1], [9, 30], group=2)
    want_cache = b.kv_cache.clone()
    backend = get_attention_backend("native")
    want = backend.forward(b.query, b.key, b.value, want_cache, b.meta, b.scale)

    def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor):
        return backend.forward(q, k, v, cache, b.meta, b.scale) * 2

    compiled = torch.compile(step, backend="eager", fullgraph=True)  # graph breaks would raise
    got = compiled(b.query, b.key, b.value, b.kv_cache)
    assert torch.equal(b.kv_cache, want_cache)
    torch.testing.assert_close(got, want * 2)
