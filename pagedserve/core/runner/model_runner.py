"""Turns a step plan into tensors, runs the model, samples. Owns every tensor of a step.

The scheduler's plan arrays are numpy views; they become tensors here with one copy each
(torch.from_numpy shares memory on the CPU, so the copy is the dtype cast or the upload). The
sampling batch is built here from the sampling sequences. A seeded sequence draws the token at
output position i from a torch.Generator seeded from (its seed, i) (the seed is kept here,
keyed by seq_id, from `add_sequence` until `release`): its tokens then depend on nothing but
the request, whatever the batch, preemptions or speculation did. A verification chunk's rows
sample as the decode steps they stand for (spec_decode/verify.py), and the result says how many
drafts each row keeps. What leaves is plain: token ids as numpy, logprobs as TokenLogprob,
embeddings as lists of floats (the Pooler pools the hidden states of embedding requests,
core/runner/pooler.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import numpy as np
import torch

from pagedserve.core.attention.base import AttentionMetadata, kv_cache_shape, kv_row_size
from pagedserve.core.distributed.step import StepInputs
from pagedserve.core.executor.launcher import TensorParallel
from pagedserve.core.lora.registry import LoraRegistry
from pagedserve.core.lora.weights import LoraBatch
from pagedserve.core.lora_request import LoRARequest
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.base import CausalLM
from pagedserve.core.models.gemma3_vl import Gemma3ForConditionalGeneration
from pagedserve.core.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from pagedserve.core.multimodal.inputs import MultiModalInputs
from pagedserve.core.outputs import TokenLogprob
from pagedserve.core.pooling_params import PoolerConfig, PoolingSpec
from pagedserve.core.request import Sequence
from pagedserve.core.runner.images import ImageRunner
from pagedserve.core.runner.memory import describe_memory
from pagedserve.core.runner.pooler import Pooler
from pagedserve.core.runner.step_result import PromptLogprobsSpec, StepResult
from pagedserve.core.sampling.sampler import Sampler, SamplingBatch, SamplingRow, prompt_logprobs
from pagedserve.core.sched.kv_cache import KVCacheSpec
from pagedserve.core.sched.scheduler import StepPlan
from pagedserve.core.spec_decode.draft import DraftModel
from pagedserve.core.spec_decode.verify import Verification, num_accepted, verification

logger = logging.getLogger(__name__)
ENCODER_CACHE_BYTES = 512 * 1024 * 1024
"""Recent images' embeddings kept by a vision-language model's runner (LRU)."""


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
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
        draft: DraftModel | None = None,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        """`arch` is the model's shape on this rank (model.arch: a rank's share of the heads
        under tensor parallelism, whose KV cache holds its own heads only). `pooler`: how
        embedding requests pool (None: the model serves none; never under tensor parallelism,
        whose workers compute the logits of every sampled row)."""
        assert pooler is None or tp is None, "embeddings run at tensor_parallel_size 1"
        self.pooler = Pooler(pooler, model.compute_logits) if pooler is not None else None
        self.draft = draft
        """The draft model of --speculative-method draft (its own weights and KV cache)."""
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
        self._seeds: dict[int, int] = {}
        self._unseeded = torch.Generator(device=device)
        """Draws of the rows without a seed: one generator, seeded by `seed_unseeded`."""
        self.lora: LoraRegistry | None = None
        """The loaded LoRA adapters and their slots (engine/build.py, under --enable-lora)."""
        self._lora_slots: dict[int, int] = {}  # seq_id -> its adapter's slot
        self.kv_dtype = kv_dtype or dtype
        """The KV cache's dtype (attention/base.py's kv_cache_dtype): the model's, or int8."""
        shape = kv_cache_shape(
            num_pages, page_size, arch.num_kv_heads, arch.head_size, self.kv_dtype
        )
        # zeros, not empty: the whole pool is committed now, as the KV budget says. With lazily
        # mapped memory RSS would creep for as long as requests first touch pages (the
        # allocator hands out never-used pages before evicting cached ones), and those first
        # touches would page-fault inside the step.
        self.kv_caches = [
            torch.zeros(shape, dtype=self.kv_dtype, device=device) for _ in range(arch.num_layers)
        ]
        self.images: ImageRunner | None = None
        """A vision-language model's image steps and encoder cache."""
        if isinstance(model, Qwen2_5_VLForConditionalGeneration | Gemma3ForConditionalGeneration):
            self.images = ImageRunner(model, device, ENCODER_CACHE_BYTES)
        models = [model] if draft is None else [model, draft.model]
        kv = self.kv_caches if draft is None else [*self.kv_caches, *draft.kv_caches]
        logger.info("%s", describe_memory(models, kv, device))

    @staticmethod
    def kv_spec(arch: ArchConfig, page_size: int, dtype: torch.dtype) -> KVCacheSpec:
        """The KV cache's sizes with `dtype` the cache's (an int8 cache's rows carry a scale)."""
        return KVCacheSpec(
            num_layers=arch.num_layers,
            num_kv_heads=arch.num_kv_heads,
            head_size=arch.head_size,
            page_size=page_size,
            dtype_bytes=torch.empty((), dtype=dtype).element_size(),
            scale_bytes=kv_row_size(0, dtype),
            dtype_name=str(dtype).removeprefix("torch."),
        )

    def add_sequence(
        self, seq_id: int, seed: int | None, lora_request: LoRARequest | None = None
    ) -> None:
        """A new sequence; a seeded one samples from its own generators, whatever the batch;
        one with an adapter runs with it (LoRANotFoundError if it is no longer loaded)."""
        if lora_request is not None:
            if self.lora is None:
                raise ValueError("this engine serves no LoRA adapters (--enable-lora)")
            self._lora_slots[seq_id] = self.lora.acquire(lora_request)
        if seed is not None:
            self._seeds[seq_id] = seed

    def seed_unseeded(self, seed: int) -> None:
        """Seed the generator of unseeded rows (once, from --seed): the same requests in the
        same steps then sample the same tokens."""
        self._unseeded.manual_seed(seed)

    def add_images(self, seq_id: int, inputs: MultiModalInputs, num_prompt: int) -> None:
        """The sequence's prompt carries these images (placeholder ids at their tokens)."""
        if self.images is None:
            raise ValueError("this model does not take images")
        self.images.add(seq_id, inputs, num_prompt)

    def release(self, seq_id: int) -> None:
        """The sequence is done (finished or aborted): drop what is kept for it."""
        self._seeds.pop(seq_id, None)
        if self.images is not None:
            self.images.release(seq_id)
        slot = self._lora_slots.pop(seq_id, None)
        if slot is not None and self.lora is not None:
            self.lora.release(slot)
        if self.pooler is not None:
            self.pooler.release(seq_id)
        if self.draft is not None:
            self.draft.release(seq_id)

    def propose_drafts(self, requests: list[tuple[int, list[int], int]]) -> dict[int, list[int]]:
        """The draft model's tokens: (seq_id, prompt + output, most drafts) -> drafts."""
        assert self.draft is not None, "no draft model (--speculative-method draft)"
        return self.draft.propose(requests)

    def _generator(self, seed: int, position: int) -> torch.Generator:
        """The draws of output position `position` of a sequence seeded `seed`."""
        generator = torch.Generator(device=self.device)
        generator.manual_seed(_mix(seed, position))
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
            slots = self._lora_request_slots(plan)  # once: the broadcast and our LoraBatch
            inputs = self._inputs(plan, prompt_specs, slots)
            m = self.model
            lora = self._lora_batch(plan, slots)
            images = self.images.step(plan) if self.images is not None else None
            if images is not None and self.images is not None:
                vlm = self.images.model
                hidden = vlm(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta,
                             lora, images=images)  # fmt: skip
            else:
                hidden = m(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, lora)
            embeddings = self._pool(hidden, pooling_specs or [])
            sample_rows, keep = self._sampling_rows(plan, inputs.sample_rows, embeddings)
            # [num_sampling, vocab] fp32; none at all in a step of embedding requests only
            logits = m.compute_logits(hidden[sample_rows]) if sample_seqs else None
            prompt_logits = self._prompt_logits(hidden, prompt_specs)
        token_ids = np.zeros(len(plan.sample_seq_ids), dtype=np.int32)
        logprobs = None
        checks = verification(plan)
        if logits is not None:
            batch = self._sampling_batch(sample_seqs, _prefixes(checks, keep))
            sampled = self.sampler(logits, batch)
            token_ids[keep] = sampled.token_ids.numpy()
            logprobs = _scatter(sampled.logprobs, keep, len(token_ids))
        result = StepResult(
            token_ids=token_ids,
            logprobs=logprobs,
            prompt_logprobs=self._prompt_logprobs(prompt_logits, prompt_specs),
            embeddings=embeddings,
        )
        if checks is not None:
            result.num_accepted = accepted = num_accepted(plan, checks, token_ids)
            result.verified = {first: (d, int(accepted[row])) for row, first, d in checks.groups}
        return result

    def _lora_batch(self, plan: StepPlan, slots: np.ndarray | None) -> LoraBatch | None:
        """The step's token rows grouped by adapter, from each request's slot (None: every row
        is the base model's)."""
        if slots is None:
            return None
        token_slots = np.repeat(slots, plan.num_scheduled_tokens)
        return LoraBatch.build(token_slots, self.dtype, self.device)

    def _lora_request_slots(self, plan: StepPlan) -> np.ndarray | None:
        """Each request's adapter slot (-1: the base), or None where no request has one."""
        if not self._lora_slots:
            return None
        slots = np.array([self._lora_slots.get(s, -1) for s in plan.seq_ids.tolist()])
        return slots if (slots >= 0).any() else None

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

    def _inputs(
        self, plan: StepPlan, specs: list[PromptLogprobsSpec], lora_slots: np.ndarray | None
    ) -> StepInputs:
        if self.tp is not None:  # the workers get the same inputs by broadcast
            rows = [(spec.row_start, len(spec.target_ids)) for spec in specs]
            return self.tp.channel.send(plan, rows, lora_slots)
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

    def _sampling_batch(
        self, seqs: list[Sequence], prefixes: list[list[int]] | None = None
    ) -> SamplingBatch:
        """One row per sampling entry; `prefixes` (aligned, for a step with verification
        chunks): the drafts an entry's position comes after, as if already produced."""
        rows = []
        for i, seq in enumerate(seqs):
            request = seq.request
            output: list[int] = seq.output_token_ids
            drafts = prefixes[i] if prefixes is not None else []
            if drafts:
                output = output + drafts
            seed = self._seeds.get(seq.seq_id)
            rows.append(
                SamplingRow(
                    params=request.params,
                    prompt_token_ids=request.text_ids(),
                    output_token_ids=output,
                    generator=None if seed is None else self._generator(seed, len(output)),
                    grammar=seq.grammar,
                    grammar_prefix=drafts,
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


def _mix(seed: int, position: int) -> int:
    """A 64-bit generator seed from (seed, position): splitmix64's finalizer over both."""
    x = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


_MASK64 = (1 << 64) - 1


def _prefixes(checks: Verification | None, keep: np.ndarray) -> list[list[int]] | None:
    """The drafts before each sampling row's position (rows: the kept logits entries)."""
    if checks is None:
        return None
    return [checks.prefixes[i] for i in keep.tolist()]


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
