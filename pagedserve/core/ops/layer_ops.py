"""Fused per-token ops of a Llama layer, native on CPU (namespace `pagedserve`).

    rms_norm(x, weight, eps) -> out               F.rms_norm over the last dim
    rotary(qk, cos, signed_sin)                   apply_rotary (in place on CPU)
    silu_and_mul(gate_up) -> out                  F.silu(gate) * up over [n, 2 * I] -> [n, I]

On CPU in float32 or bfloat16 these call the kernels of pagedserve._core (fp32 math, one
rounding; float32 results equal torch's expressions bit for bit). Anywhere else (CUDA, float16)
they return those torch expressions, so other devices run exactly as before. The native bodies
(`*_eager`, output tensors passed in) are NativeOps (ops/base.py): registered custom ops for
traced code, called straight by eager code. Their checks raise ValueError naming the argument.
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F

from pagedserve.core.ops import native
from pagedserve.core.ops.base import CPU_DTYPES, DTYPES, NativeOp, check_rows
from pagedserve.core.ops.native import require

_core = native.core
# The native mean sums in the order of torch's CPU sum kernel, whose vectors hold 8 floats (its
# AVX2 build runs even where torch reports AVX512); tests check the float32 results bit for bit.
_SUM_LANES = 8


@cache
def torch_vector_lanes() -> int:
    """Floats in one of torch's CPU vectors where it runs its elementwise kernels: 16 with its
    AVX512 kernels, 8 with AVX2 (its capability, chosen by torch from the CPU)."""
    return 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


def _native(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.dtype in CPU_DTYPES


def _check_native(name: str, t: torch.Tensor) -> None:
    require(_native(t), "{} must be on cpu in float32 or bfloat16, got {} on {}", name, t.dtype,
             t.device)  # fmt: skip


def _check_norm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """x and out [n, hidden] with contiguous rows; weight [hidden] contiguous; one dtype, device."""
    _check_native("x", x)
    require(x.dim() == 2, "x must be [num_tokens, hidden_size], got {}", tuple(x.shape))
    hidden = x.shape[1]
    check_rows("x", x, x, "x", hidden_size=hidden)
    check_rows("out", out, x, "x", hidden_size=hidden)
    require(out.shape[0] == x.shape[0], "out has {} rows, x has {}", out.shape[0], x.shape[0])
    require(weight.shape == (hidden,), "weight must be [{}], got {}", hidden,
            tuple(weight.shape))  # fmt: skip
    require(weight.dtype == x.dtype and weight.device == x.device,
            "weight must be {} on {}", x.dtype, x.device)  # fmt: skip
    require(weight.is_contiguous(), "weight must be contiguous")
    require(eps >= 0.0, "eps must be >= 0, got {}", eps)


def rms_norm_eager(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """out [n, hidden] = rms_norm(x [n, hidden]) * weight [hidden]."""
    _check_norm(out, x, weight, eps)
    _core.rms_norm(
        out=out.data_ptr(),
        out_stride=out.stride(0),
        x=x.data_ptr(),
        x_stride=x.stride(0),
        weight=weight.data_ptr(),
        num_rows=x.shape[0],
        hidden_size=x.shape[1],
        eps=eps,
        dtype=DTYPES[x.dtype],
        sum_lanes=_SUM_LANES,
        num_threads=torch.get_num_threads(),
    )


def _check_rotary(qk: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    _check_native("qk", qk)
    require(qk.dim() == 3, "qk must be [num_tokens, heads, head_size], got {}", tuple(qk.shape))
    n, head_size = qk.shape[0], qk.shape[2]
    require(head_size % 2 == 0, "qk head_size must be even, got {}", head_size)
    require(qk.stride(2) == 1, "qk must be contiguous in its last dim")
    for name, table in (("cos", cos), ("signed_sin", signed_sin)):
        # [n, 1, head_size] (a broadcast row per token) or [n, head_size]
        require(table.dim() in (2, 3) and table.shape[0] == n and table.shape[-1] == head_size
                 and table.numel() == n * head_size,
                 "{} must be [{}, 1, {}] or [{}, {}], got {}", name, n, head_size, n, head_size,
                 tuple(table.shape))  # fmt: skip
        require(table.dtype == qk.dtype and table.device == qk.device,
                 "{} must be {} on {}", name, qk.dtype, qk.device)  # fmt: skip
        require(table.stride(-1) == 1, "{} must be contiguous in its last dim", name)


def rotary_eager(qk: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    """In place: qk [n, heads, head_size] = qk * cos + roll(qk, head_size / 2) * signed_sin."""
    _check_rotary(qk, cos, signed_sin)
    n, heads, head_size = qk.shape
    _core.rotary(
        qk=qk.data_ptr(),
        token_stride=qk.stride(0),
        head_stride=qk.stride(1),
        cos=cos.data_ptr(),
        cos_stride=cos.stride(0),
        signed_sin=signed_sin.data_ptr(),
        signed_sin_stride=signed_sin.stride(0),
        num_tokens=n,
        num_heads=heads,
        head_size=head_size,
        dtype=DTYPES[qk.dtype],
        num_threads=torch.get_num_threads(),
    )


def _check_silu(out: torch.Tensor, gate_up: torch.Tensor) -> None:
    _check_native("gate_up", gate_up)
    require(gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0,
             "gate_up must be [num_tokens, 2 * intermediate_size], got {}",
             tuple(gate_up.shape))  # fmt: skip
    check_rows("gate_up", gate_up, gate_up, "gate_up", width=gate_up.shape[1])
    check_rows("out", out, gate_up, "gate_up", intermediate_size=gate_up.shape[1] // 2)
    require(out.shape[0] == gate_up.shape[0], "out has {} rows, gate_up has {}", out.shape[0],
             gate_up.shape[0])  # fmt: skip


def silu_and_mul_eager(out: torch.Tensor, gate_up: torch.Tensor) -> None:
    """out [n, I] = silu(gate_up[:, :I]) * gate_up[:, I:]."""
    _check_silu(out, gate_up)
    _core.silu_and_mul(
        out=out.data_ptr(),
        out_stride=out.stride(0),
        gate_up=gate_up.data_ptr(),
        gate_up_stride=gate_up.stride(0),
        num_rows=out.shape[0],
        intermediate_size=out.shape[1],
        dtype=DTYPES[out.dtype],
        torch_lanes=torch_vector_lanes(),
        num_threads=torch.get_num_threads(),
    )


rms_norm_op = NativeOp.declare("rms_norm", rms_norm_eager, _check_norm, mutates=("out",))
rotary_op = NativeOp.declare("rotary", rotary_eager, _check_rotary, mutates=("qk",))
silu_and_mul_op = NativeOp.declare(
    "silu_and_mul", silu_and_mul_eager, _check_silu, mutates=("out",)
)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, heads, head_size]; cos/signed_sin [num_tokens, 1, head_size].

    The torch form, and the reference rotary (native on CPU) must equal."""
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, x.roll(half, dims=-1), signed_sin)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """[n, hidden] -> a new [n, hidden]."""
    if not _native(x):
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    out = torch.empty(x.shape, dtype=x.dtype)
    rms_norm_op(out, x, weight, eps)
    return out


def rotary(qk: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary; on CPU in place into qk (which it returns)."""
    if not _native(qk):
        return apply_rotary(qk, cos, signed_sin)
    rotary_op(qk, cos, signed_sin)
    return qk


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[n, 2 * I] -> a new [n, I] = silu(gate) * up."""
    size = gate_up.shape[-1] // 2
    if not _native(gate_up):
        return F.silu(gate_up[:, :size]) * gate_up[:, size:]
    out = torch.empty((gate_up.shape[0], size), dtype=gate_up.dtype)
    silu_and_mul_op(out, gate_up)
    return out
