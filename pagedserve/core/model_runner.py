"""Turns a step plan into tensors, runs the model, samples. Owns every tensor of a step.

The scheduler's plan arrays are numpy views; they become tensors here with one copy each
(torch.from_numpy shares memory on the CPU, so the copy is the dtype cast or the upload). The
sampling batch is built here from the sampling sequences, with each seeded sequence's own
torch.Generator (kept here, keyed by seq_id, from `add_sequence` until `release`). What leaves
is plain: token ids as numpy, logprobs as TokenLogprob, embeddings as lists of floats (the
Pooler pools the hidden states of embedding requests, core/pooler.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from pagedserve.core.attention.base import AttentionMetadata, kv_cache_shape
from pagedserve.core.distributed.launcher import TensorParallel
from pagedserve.core.distributed.step import StepInputs
from pagedserve.core.kv_cache import KVCacheSpec
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.llama import LlamaForCausalLM
from pagedserve.core.outputs import TokenLogprob
from pagedserve.core.pooler import Pooler
from pagedserve.core.pooling_params import PoolerConfig, PoolingSpec
from pagedserve.core.request import Sequence
from pagedserve.core.sampler import Sampler, SamplingBatch, SamplingRow, prompt_logprobs
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
    token_ids: np.ndarray
    """int32, one sampled token per entry of the plan's sample_seq_ids, in that order."""
    logprobs: list[TokenLogprob | None] | None
    """Per sampled row when any row asked (None for the rows that did not); None otherwise."""
    prompt_logprobs: dict[int, list[TokenLogprob]]
    """seq_id -> the logprobs of this step's prompt chunk (PromptLogprobsSpec.target_ids)."""
    embeddings: dict[int, list[float]] = field(default_factory=dict)
    """seq_id -> the vector of each embedding request whose prompt ended this step (its
    entry in token_ids is a placeholder 0)."""


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        arch: ArchConfig,
        *,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        tp: TensorParallel | None = None,
        pooler: PoolerConfig | None = None,
    ) -> None:
        """`arch` is the model's shape on this rank (model.arch: a rank's share of the heads
        under tensor parallelism, whose KV cache holds its own heads only). `pooler`: how
        embedding requests pool (None: the model serves none; never under tensor parallelism,
        whose workers compute the logits of every sampled row)."""
        assert pooler is None or tp is None, "embeddings run at tensor_parallel_size 1"
        self.pooler = Pooler(pooler) if pooler is not None else None
        self.model = model
        self.tp = tp
        self.arch = arch
        self.device = device
        self.dtype = dtype
        self.page_size = page_size
        self.num_pages = num_pages
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.sampler = Sampler()
        self._generators: dict[int, torch.Generator] = {}
        self._unseeded = torch.Generator(device=device)
        """Draws of the rows without a seed: one generator, seeded by `seed_unseeded`."""
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

    def add_sequence(self, seq_id: int, seed: int | None) -> None:
        """A new sequence; a seeded one samples from its own generator, whatever the batch."""
        if seed is not None:
            self._generators[seq_id] = self._generator(seed)

    def seed_unseeded(self, seed: int) -> None:
        """Seed the generator of unseeded rows (once, from --seed): the same requests in the
        same steps then sample the same tokens."""
        self._unseeded.manual_seed(seed)

    def release(self, seq_id: int) -> None:
        """The sequence is done (finished or aborted): drop what is kept for it."""
        self._generators.pop(seq_id, None)
        if self.pooler is not None:
            self.pooler.release(seq_id)

    def _generator(self, seed: int) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        return generator

    @torch.inference_mode()
    def execute(
        self,
        plan: StepPlan,
        sample_seqs: list[Sequence],
        prompt_specs: list[PromptLogprobsSpec],
        pooling_specs: list[PoolingSpec] | None = None,
    ) -> StepResult:
        """`sample_seqs`: the sequences of plan.sample_seq_ids that sample, in that order
        (all of them but the embedding requests, whose chunks are `pooling_specs`)."""
        with self._collectives():  # every rank's forward and logits; then rank 0 samples alone
            inputs = self._inputs(plan, prompt_specs)
            m = self.model
            hidden = m(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
            embeddings = self._pool(hidden, pooling_specs or [])
            sample_rows, keep = self._sampling_rows(plan, inputs.sample_rows, embeddings)
            # [num_sampling, vocab] fp32; none at all in a step of embedding requests only
            logits = m.compute_logits(hidden[sample_rows]) if sample_seqs else None
            prompt_logits = self._prompt_logits(hidden, prompt_specs)
        token_ids = np.zeros(len(plan.sample_seq_ids), dtype=np.int32)
        logprobs = None
        if logits is not None:
            sampled = self.sampler(logits, self._sampling_batch(sample_seqs))
            token_ids[keep] = sampled.token_ids.numpy()
            logprobs = _scatter(sampled.logprobs, keep, len(token_ids))
        return StepResult(
            token_ids=token_ids,
            logprobs=logprobs,
            prompt_logprobs=self._prompt_logprobs(prompt_logits, prompt_specs),
            embeddings=embeddings,
        )

    def _pool(self, hidden: torch.Tensor, specs: list[PoolingSpec]) -> dict[int, list[float]]:
        if not specs:
            return {}
        if self.pooler is None:
            raise ValueError("this model serves no embeddings (it has no pooler)")
        return self.pooler(hidden, specs)

    @staticmethod
    def _sampling_rows(
        plan: StepPlan, sample_rows: torch.Tensor, embeddings: dict[int, list[float]]
    ) -> tuple[torch.Tensor, np.ndarray]:
        """The rows that sample (every sampled row but the embedding requests'), and their
        indices among plan.sample_seq_ids."""
        if not embeddings:
            return sample_rows, np.arange(len(plan.sample_seq_ids))
        seq_ids = plan.sample_seq_ids.tolist()
        keep = np.array([i for i, s in enumerate(seq_ids) if s not in embeddings], dtype=np.int64)
        return sample_rows[torch.from_numpy(keep).to(sample_rows.device)], keep

    def _collectives(self) -> contextlib.AbstractContextManager[None]:
        return self.tp.stepping() if self.tp is not None else contextlib.nullcontext()

    def _inputs(self, plan: StepPlan, specs: list[PromptLogprobsSpec]) -> StepInputs:
        if self.tp is not None:  # the workers get the same inputs by broadcast
            rows = [(spec.row_start, len(spec.target_ids)) for spec in specs]
            return self.tp.channel.send(plan, rows)
        return StepInputs(
            input_ids=self._tensor(plan.input_ids, torch.long),
            positions=self._tensor(plan.positions, torch.long),
            meta=self._metadata(plan),
            sample_rows=self._tensor(plan.logits_indices, torch.long),
            prompt_rows=[],
        )

    @property
    def fault(self) -> str | None:
        """Why the tensor-parallel ranks can no longer step (None: they can, or TP=1)."""
        return self.tp.fault if self.tp is not None else None

    def on_fault(self, callback: Callable[[str], None]) -> None:
        """callback(reason), from another thread, when a tensor-parallel worker fails."""
        if self.tp is not None:
            self.tp.watch(callback)

    def close(self) -> None:
        """Stop the tensor-parallel workers (nothing to do at TP=1)."""
        if self.tp is not None:
            self.tp.close()

    def _sampling_batch(self, seqs: list[Sequence]) -> SamplingBatch:
        rows = []
        for seq in seqs:
            request = seq.request
            rows.append(
                SamplingRow(
                    params=request.params,
                    prompt_token_ids=request.prompt_token_ids,
                    output_token_ids=seq.output_token_ids,
                    generator=self._generators.get(seq.seq_id),
                    grammar=seq.grammar,
                )
            )
        return SamplingBatch.build(
            rows,
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_token_ids,
            device=self.device,
            shared_generator=self._unseeded,
        )

    def _prompt_logits(
        self, hidden: torch.Tensor, specs: list[PromptLogprobsSpec]
    ) -> list[torch.Tensor | None]:
        """Each chunk's logits (None for an empty one), in order (a worker does the same)."""
        result: list[torch.Tensor | None] = []
        for spec in specs:
            rows = hidden[spec.row_start : spec.row_start + len(spec.target_ids)]
            result.append(self.model.compute_logits(rows) if spec.target_ids else None)
        return result

    def _prompt_logprobs(
        self, logits: list[torch.Tensor | None], specs: list[PromptLogprobsSpec]
    ) -> dict[int, list[TokenLogprob]]:
        result: dict[int, list[TokenLogprob]] = {}
        for spec, chunk in zip(specs, logits, strict=True):
            if chunk is None:
                result[spec.seq_id] = []
                continue
            targets = torch.tensor(spec.target_ids, dtype=torch.long, device=chunk.device)
            result[spec.seq_id] = prompt_logprobs(chunk, targets, spec.k)
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


def _scatter(
    logprobs: list[TokenLogprob | None] | None, keep: np.ndarray, size: int
) -> list[TokenLogprob | None] | None:
    """Per-sampling-row logprobs laid out per entry of the plan's sample_seq_ids."""
    if logprobs is None or len(keep) == size:
        return logprobs
    full: list[TokenLogprob | None] = [None] * size
    for index, logprob in zip(keep.tolist(), logprobs, strict=True):
        full[index] = logprob
    return full
