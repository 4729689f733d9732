# Type stubs of the compiled module pagedserve._cuda (cpp/bindings/), for mypy.
# Generated with `pybind11-stubgen pagedserve._cuda` from the built module, then formatted with
# ruff; regenerate after changing the bindings (scripts/gen_stubs.sh). tests/native/test_stubs.py
# checks that the stub and the built module name the same things.
"""
pagedserve CUDA paged-attention kernels (raw device pointers, caller's stream)
"""

from __future__ import annotations

import typing

import pagedserve._core

__all__: list[str] = ["DECODE_SPLIT_LEN", "paged_attention", "reshape_and_cache"]

def paged_attention(
    args: pagedserve._core.AttentionArgs,
    workspace: typing.SupportsInt | typing.SupportsIndex,
    max_splits: typing.SupportsInt | typing.SupportsIndex,
    stream: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def reshape_and_cache(
    args: pagedserve._core.CacheWriteArgs, stream: typing.SupportsInt | typing.SupportsIndex
) -> None: ...

DECODE_SPLIT_LEN: int = 512
