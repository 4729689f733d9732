"""Turns a step plan into tensors, runs the model, samples. The only owner of device memory.

The scheduler's plan arrays are numpy views; they become tensors here with one copy each
(torch.from_numpy shares memory on the CPU, so the copy is the dtype cast or the upload).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pagedserve.core.attention.base import AttentionMetadata, kv_cache_shape
from pagedserve.core.kv_cache import KVCacheSpec
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.outputs import TokenLogprob
from pagedserve.core.sampler import Sampler, SamplerOutput, SamplingBatch, prompt_logprobs
from pagedserve.core.scheduler import StepPlan


@dataclass
class PromptLogprobsSpec:
    """Logprobs of prompt tokens for one request's prefill chunk (echo / prompt_logprobs)."""

    seq_id: int
    row_start: int
    """First token row of the chunk in the step's batch."""
    target_ids: list[int]
    """The prompt tokens that rows row_start.. predict (the chunk's next tokens)."""
    k: int


@dataclass
class StepResult:
    sampled: SamplerOutput
    prompt_logprobs: dict[int, list[TokenLogprob]]


class ModelRunner:
    def __init__(
        self,
        model: nn.Module,
        arch: ArchConfig,
        *,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.model = model
        self.arch = arch
        self.device = device
        self.dtype = dtype
        self.page_size = page_size
        self.num_pages = num_pages
        self.sampler = Sampler()
        shape = kv_cache_shape(num_pages, page_size, arch.num_kv_heads, arch.head_size)
        # zeros, not empty: the whole pool is committed now, as the KV budget says. With lazily
        # mapped memory RSS would creep for as long as requests first touch pages (the
        # allocator hands out never-used pages before evicting cached ones), and those first
        # touches would page-fault inside the step.
        self.kv_caches = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(arch.num_layers)
        ]

    @staticmethod
    def kv_spec(arch: ArchConfig, page_size: int, dtype: torch.dtype) -> KVCacheSpec:
        return KVCacheSpec(
            num_layers=arch.num_layers,
            num_kv_heads=arch.num_kv_heads,
            head_size=arch.head_size,
            page_size=page_size,
            dtype_bytes=torch.empty((), dtype=dtype).element_size(),
        )

    @torch.inference_mode()
    def execute(
        self,
        plan: StepPlan,
        sampling: SamplingBatch,
        prompt_specs: list[PromptLogprobsSpec],
    ) -> StepResult:
        input_ids = self._tensor(plan.input_ids, torch.long)
        positions = self._tensor(plan.positions, torch.long)
        meta = self._metadata(plan)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)  # [num_tokens, hidden]

        sample_rows = self._tensor(plan.logits_indices, torch.long)
        logits = self.model.compute_logits(hidden[sample_rows])  # [num_sampled, vocab] fp32
        sampled = self.sampler(logits, sampling)
        return StepResult(sampled, self._prompt_logprobs(hidden, prompt_specs))

    def _prompt_logprobs(
        self, hidden: torch.Tensor, specs: list[PromptLogprobsSpec]
    ) -> dict[int, list[TokenLogprob]]:
        result: dict[int, list[TokenLogprob]] = {}
        for spec in specs:
            if not spec.target_ids:
                result[spec.seq_id] = []
                continue
            rows = hidden[spec.row_start : spec.row_start + len(spec.target_ids)]
            logits = self.model.compute_logits(rows)
            targets = torch.tensor(spec.target_ids, dtype=torch.long, device=logits.device)
            result[spec.seq_id] = prompt_logprobs(logits, targets, spec.k)
        return result

    def _metadata(self, plan: StepPlan) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self._tensor(plan.slot_mapping, torch.long),
            page_table=self._tensor(plan.page_table, torch.int32),
            seq_lens=self._tensor(plan.seq_lens, torch.int32),
            query_start_loc=self._tensor(plan.query_start_loc, torch.int32),
            max_query_len=int(plan.max_query_len),
            max_seq_len=int(plan.max_seq_len),
        )

    def _tensor(self, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        # A copy: the plan's (read-only) views are reused by the next schedule().
        return torch.tensor(array, dtype=dtype, device=self.device)
