"""GGUF quantized rows for the quantized-kernel tests, and their numpy oracles.

    rows = gguf_rows(qtype, n, k, seed)        [n, row bytes] uint8 blocks
    w = dequantized(rows, qtype)               gguf.quants.dequantize -> [n, k] float32
    xq = int8_activations(x)                   the kernel's per-32 int8 rounding, as float32

Q4_0, Q4_1 and Q8_0 come from gguf.quants.quantize of random weights; gguf's Python package
has no quantizer for the K-quants, so their blocks are random bytes (every bit pattern of the
quants and sub-scales is a valid block) with the fp16 super-block scales set to sane values.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

TYPES = (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K)
_HALF_SCALES = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}  # byte offsets of fp16 d/dmin


def gguf_rows(qtype: Q, n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if qtype not in _HALF_SCALES:
        weight = rng.standard_normal((n, k)).astype(np.float32) * k**-0.5
        return np.ascontiguousarray(quantize(weight, qtype))
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n * k // block, size), dtype=np.uint8)
    for offset in _HALF_SCALES[qtype]:
        scale = rng.uniform(0.2, 1.0, size=len(blocks)) * 0.05 * k**-0.5
        blocks[:, offset : offset + 2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return np.ascontiguousarray(blocks.reshape(n, -1))


def dequantized(rows: np.ndarray, qtype: Q) -> np.ndarray:
    return np.asarray(dequantize(rows, qtype), dtype=np.float32).reshape(rows.shape[0], -1)


def row_addresses(rows: np.ndarray) -> np.ndarray:
    """Each row's address: rows must stay referenced while they are read (a temporary's memory
    is freed, and may be reused, as soon as this returns)."""
    return rows.ctypes.data + np.arange(rows.shape[0], dtype=np.int64) * rows.strides[0]


def int8_activations(x: np.ndarray, qmax: int = 127) -> np.ndarray:
    """x [m, k] float32 as the kernel sees it: per 32 features d = max|x| / qmax and
    q = round-half-even(x * (qmax / max|x|)), returned as d * q (float64). qmax 127: the int8
    rows; 32512: the int16 rows (int16_activations)."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(qmax) / np.where(amax > 0, amax, 1), np.float32(0))
    q = np.rint(blocks * inv.astype(np.float32))
    d = (amax / np.float32(qmax)).astype(np.float32)
    return (q.astype(np.float64) * d).reshape(x.shape)
