"""Where start-up memory went, for the start-up line (issue 42): the model's tensors, the KV
cache, and the rest of the process (torch and the libraries, the tokenizer, allocator slack).

    describe_memory([model, draft], kv_caches, device)
    # "memory: weights 92.4 MiB, KV cache 2048.0 MiB, rest of the process 391.7 MiB (RSS 2532.1
    #  MiB, peak 2710.3 MiB)"

Tensors that share storage (tied embeddings, a view) count once. The per-step activations are not
allocated yet at start-up: they come out of "the rest" as the first steps run.

    give_back_loading_memory()   after the weights load, before the KV cache is allocated

drops what loading leaves behind that nothing reads again (issue 42 item 4), so that it counts
neither in the process's RSS nor in its peak.
"""

from __future__ import annotations

import ctypes
import resource
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

from pagedserve.core.gguf_reader import forget_readers
from pagedserve.core.models.base import CausalLM

MiB = 1 << 20


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind `tensors`, each storage once."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor.device.type == "meta":
            continue
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def rss_bytes() -> tuple[int, int]:
    """This process's resident memory now and at its peak (0, 0 where /proc is missing)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0, 0
    now = pages * resource.getpagesize()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return now, max(now, peak)


def give_back_loading_memory() -> None:
    """The parsed GGUF readers (gguf_reader.forget_readers: ~40 MiB for the default model's
    vocabulary), then the allocator's free pages (trim_malloc)."""
    forget_readers()
    trim_malloc()


def trim_malloc() -> bool:
    """glibc's malloc_trim(0): hand back to the system the free pages of every arena. Loading
    frees its transient buffers (dequantized tensors, the tokenizer's build, the readers), but
    glibc keeps the pages for reuse. False where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):  # musl: no libc.so.6, or no malloc_trim
        return False


def describe_memory(
    models: Iterable[CausalLM], kv_caches: Iterable[torch.Tensor], device: torch.device
) -> str:
    weights = tensor_bytes(t for model in models for t in model.weight_tensors())
    kv = tensor_bytes(kv_caches)
    text = f"memory: weights {weights / MiB:.1f} MiB, KV cache {kv / MiB:.1f} MiB"
    if device.type != "cpu":
        return f"{text} on {device}"
    now, peak = rss_bytes()
    if not now:
        return text
    rest = now - weights - kv
    return (
        f"{text}, rest of the process {rest / MiB:.1f} MiB "
        f"(RSS {now / MiB:.1f} MiB, peak {peak / MiB:.1f} MiB)"
    )
