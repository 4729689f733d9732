"""LLMEngine: requests in, one step at a time, deltas out. Single-threaded by design.

A step is three named calls: `plan = scheduler.schedule()`, `result = model_runner.execute(...)`,
`outputs = output_processor.process(plan, result)`. Tensors (the sampling batch, per-sequence
generators) live in the model runner, token -> text -> output work in the output processor; this
module holds admission and the request tables' life cycle. An embedding request (PoolingParams)
is a prefill-only request through the same scheduler: it holds a seat and KV pages while its
prompt runs, batches with every other request, and finishes in the step its prompt ends. Everything here runs on the engine
thread (or the caller's, offline); AsyncEngine is the only bridge to asyncio.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable

from pagedserve.core.config import EngineConfig
from pagedserve.core.engine import admission, step_inputs
from pagedserve.core.engine.build import build_engine_parts
from pagedserve.core.engine.kv_events import start_kv_events
from pagedserve.core.engine.output_processor import OutputProcessor
from pagedserve.core.engine.parts import EngineParts
from pagedserve.core.errors import EngineDeadError
from pagedserve.core.lora.registry import LoraRegistry
from pagedserve.core.lora_request import LoRAError, LoRARequest
from pagedserve.core.multimodal.inputs import MultiModalInputs
from pagedserve.core.outputs import EngineStats, RequestMetrics, RequestOutput
from pagedserve.core.pooling_params import PoolingParams
from pagedserve.core.request import Request, Sequence
from pagedserve.core.runner.model_runner import ModelRunner
from pagedserve.core.sampling_params import SamplingParams
from pagedserve.core.sched.scheduler import StepPlan
from pagedserve.core.spec_decode.speculator import Speculator
from pagedserve.core.structured import GrammarCache, GrammarState
from pagedserve.core.tokenizers.detokenizer import IncrementalDetokenizer

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, parts: EngineParts, config: EngineConfig) -> None:
        self.config = config
        self.tokenizer = parts.tokenizer
        self.chat_template = parts.chat_template
        self.model_info = dataclasses.replace(
            parts.model_info, speculative=config.speculative.describe()
        )
        self.scheduler = parts.scheduler
        self.model_runner = parts.model_runner
        self.max_model_len = parts.max_model_len
        self.speculator = _speculator(config, parts)
        self._release = _releaser(self.model_runner, self.speculator)
        self.output_processor = OutputProcessor(
            self.scheduler,
            eos_token_ids=parts.tokenizer.eos_token_ids,
            max_model_len=self.max_model_len,
            release=self._release,
            observe=self.speculator.observe if self.speculator is not None else None,
        )
        # The output processor's tables: it retires what finishes, the engine adds and aborts.
        self._requests = self.output_processor.requests
        self._seqs = self.output_processor.seqs
        self._seq_ids = itertools.count()
        self.batch_invariant = parts.batch_invariant
        # Draws of the requests that give no seed: one generator in the runner, seeded once from
        # --seed, so the same requests in the same order (the same steps) sample the same tokens.
        self.model_runner.seed_unseeded(config.model.seed)
        self._finished_reasons = self.output_processor.finished_reasons
        self.grammars = GrammarCache(parts.tokenizer)
        """Compiled grammars; the server fills it off the event loop before adding a request."""
        self.pooler = parts.pooler
        """How embedding requests pool; None: the model serves none."""
        self.can_generate = parts.can_generate
        self.kv_events = start_kv_events(
            config, self.scheduler, self.model_info.device, self.model_info.name
        )
        """The KV events publisher for routers (--kv-events-config); None: off."""
        self.image_processor = parts.image_processor
        """How the model takes images (None: a text-only model)."""

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        return cls(build_engine_parts(config), config)

    # ---- requests -------------------------------------------------------------------------------

    def resolve_max_tokens(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        return admission.resolve_max_tokens(self.max_model_len, num_prompt_tokens, params)

    def check_pooling(self, num_prompt_tokens: int, params: PoolingParams) -> None:
        admission.check_pooling(self.pooler, self.max_model_len, num_prompt_tokens, params)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | PoolingParams,
        max_tokens: int | None = None,
        multimodal: MultiModalInputs | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Add a request; `max_tokens` is params.max_tokens already resolved against the
        context by the caller's admission (resolved here when None); `lora_request`: the
        adapter it runs with (None: the base model)."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        vocab = self.tokenizer.vocab_size
        text_ids = prompt_token_ids
        if multimodal is not None:
            if self.image_processor is None:
                raise ValueError("this model does not take images")
            text_ids = admission.text_ids(prompt_token_ids, multimodal)
        if any(not 0 <= t < vocab for t in text_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if isinstance(params, PoolingParams):
            return self._add_pooling(request_id, prompt_token_ids, params)
        if not self.can_generate:
            raise ValueError("this model has no LM head: it serves embeddings only")
        if max_tokens is None:
            max_tokens = self.resolve_max_tokens(len(prompt_token_ids), params)
        metrics = RequestMetrics(time.monotonic(), num_prompt_tokens=len(prompt_token_ids))
        request = Request(request_id, list(prompt_token_ids), params, max_tokens, metrics)
        request.lora_request = lora_request
        if multimodal is not None:
            request.multimodal, request.text_prompt_ids = multimodal, text_ids
        if params.structured is not None:  # a cache hit when the server compiled it beforehand
            request.grammar = self.grammars.compile(params.structured)
        if params.prompt_logprobs is not None:
            request.prompt_logprobs = []
        # With the prefix cache, outputs 1..n-1 join once output 0 has filled the prompt's
        # pages, so they share them instead of computing the prompt n times.
        first_wave = 1 if self.config.cache.enable_prefix_caching else params.n
        for _ in range(first_wave):
            self._add_sequence(request)
        self._requests[request_id] = request

    def add_lora(self, name: str, path: str) -> LoRARequest:
        """Load the LoRA adapter (PEFT folder or GGUF file) at `path` as `name` (between steps: the engine thread's call);
        LoRAError naming what is wrong, and nothing changes."""
        return self._loras().load(name, path)

    def remove_lora(self, name: str) -> None:
        """New requests no longer find `name`; running ones finish with it."""
        self._loras().unload(name)

    def list_loras(self) -> list[LoRARequest]:
        lora = self.model_runner.lora
        return lora.loaded if lora is not None else []

    def _loras(self) -> LoraRegistry:
        if self.model_runner.lora is None:
            raise LoRAError("this engine serves no LoRA adapters: start it with --enable-lora")
        return self.model_runner.lora

    def _add_pooling(
        self, request_id: str, prompt_token_ids: list[int], params: PoolingParams
    ) -> None:
        self.check_pooling(len(prompt_token_ids), params)
        metrics = RequestMetrics(time.monotonic(), num_prompt_tokens=len(prompt_token_ids))
        # One placeholder token "sampled" at the prompt's end: the scheduler's prefill-only
        # request (the model runner pools instead; the token is never kept).
        request = Request(request_id, list(prompt_token_ids), _PREFILL_ONLY, 1, metrics)
        request.pooling = params
        self._add_sequence(request)
        self._requests[request_id] = request

    def _add_sequence(self, request: Request) -> None:
        index = request.num_children_added
        params = request.params
        pooled = request.pooling is not None
        seq = Sequence(
            seq_id=next(self._seq_ids),
            index=index,
            request=request,
            detokenizer=IncrementalDetokenizer(
                self.tokenizer,
                stop=params.stop,
                include_stop_str_in_output=params.include_stop_str_in_output,
                skip_special_tokens=params.skip_special_tokens,
                prompt_token_ids=() if pooled else request.text_ids(),
            ),
            grammar=GrammarState(request.grammar) if request.grammar is not None else None,
        )
        # Prompt logprobs need every prompt token computed, so output 0 skips the cache; so do
        # mean and cls pooling (the cache would skip the hidden states they sum or take).
        use_cache = not (index == 0 and params.prompt_logprobs is not None)
        if pooled and self.pooler is not None and self.pooler.uses_every_token:
            use_cache = False
        lora = request.lora_request
        # first, so that an adapter unloaded meanwhile leaves nothing behind (LoRANotFoundError)
        self.model_runner.add_sequence(seq.seq_id, self._seed(params, index), lora)
        try:  # an adapter's pages are its own: its id salts the prefix cache's hashes
            self.scheduler.add_request(seq.seq_id, request.prompt_token_ids, request.max_tokens,
                                       use_prefix_cache=use_cache,
                                       cache_salt=lora.lora_int_id if lora else 0,
                                       whole_spans=self._whole_spans(request))  # fmt: skip
        except BaseException:
            self.model_runner.release(seq.seq_id)
            raise
        if lora is not None and self.kv_events is not None:  # its pages' events name it
            self.kv_events.note_adapter(lora.lora_int_id, lora.lora_name)
        if request.multimodal is not None:
            num_prompt = len(request.prompt_token_ids)
            self.model_runner.add_images(seq.seq_id, request.multimodal, num_prompt)
        request.seqs.append(seq)
        request.num_children_added += 1
        self._seqs[seq.seq_id] = seq

    def _whole_spans(self, request: Request) -> list[tuple[int, int]]:
        """The prompt spans no prefill chunk may end inside: the images of a model whose
        image tokens attend to each other both ways (Gemma 3)."""
        processor, images = self.image_processor, request.multimodal
        if processor is None or images is None or not processor.whole_images:
            return []
        return images.spans()

    @staticmethod
    def _seed(params: SamplingParams, index: int) -> int | None:
        """Output `index` of a seeded request draws from its own generator, seeded so."""
        return None if params.seed is None else params.seed + index

    def _add_queued_children(self) -> None:
        for request in self.output_processor.take_queued_children():
            if self._requests.get(request.request_id) is not request:
                continue  # aborted or failed since it was queued
            while request.num_children_added < request.params.n:
                self._add_sequence(request)

    def abort(self, request_id: str) -> None:
        """The client is gone: its unfinished outputs end with reason `abort`."""
        request = self._requests.get(request_id)
        if request is not None:
            self._finished_reasons["abort"] += _num_unfinished(request)
        self._drop(request_id)

    def _drop(self, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        for seq in request.seqs:
            self.scheduler.abort(seq.seq_id)
            self._release(seq.seq_id)
            self._seqs.pop(seq.seq_id, None)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    def stats(self) -> EngineStats:
        scheduler = self.scheduler
        spec = self.speculator.stats if self.speculator is not None else None
        return EngineStats(
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting + self.output_processor.num_queued_children,
            **dataclasses.asdict(scheduler.stats()),
            num_generated_tokens=self.output_processor.num_generated_tokens,
            finished_reasons=dict(self._finished_reasons),
            spec_decode=dataclasses.replace(spec, accepted_per_pos=list(spec.accepted_per_pos))
            if spec is not None
            else None,
        )

    def on_fault(self, callback: Callable[[str], None]) -> None:
        """callback(reason), from another thread, when the engine can no longer step (a
        tensor-parallel worker died); never called at tensor_parallel_size 1."""
        self.model_runner.on_fault(callback)

    def close(self) -> None:
        """Release what outlives the object (the tensor-parallel workers, the KV events
        publisher's thread and sockets); call once, when no step runs."""
        self.model_runner.close()
        if self.kv_events is not None:
            self.kv_events.close()

    # ---- the step -------------------------------------------------------------------------------

    def step(self, before_execute: Callable[[], None] | None = None) -> list[RequestOutput]:
        """One step; `before_execute` runs once the step is planned, just before the model
        does (AsyncEngine hands the previous step's outputs to the event loop there). The
        prefix cache's changes in it go to the KV events publisher as one batch."""
        outputs = self._step(before_execute)
        if self.kv_events is not None:
            page_size = self.kv_events.page_size
            self.kv_events.publish_records(self.scheduler.drain_kv_events(page_size))
        return outputs

    def _step(self, before_execute: Callable[[], None] | None) -> list[RequestOutput]:
        self._add_queued_children()
        if self.speculator is not None:
            self.speculator.propose(self._seqs.values(), self.scheduler.num_running)
        plan = self.scheduler.schedule()
        if plan.num_reqs == 0:
            return []
        self._note_scheduled(plan)
        try:
            sample_seqs = step_inputs.sampling_seqs(plan, self._seqs)
            prompt_specs = step_inputs.prompt_logprobs_specs(plan, self._seqs)
            pooling_specs = step_inputs.pooling_specs(plan, self._seqs, self.pooler)
            if before_execute is not None:
                before_execute()
            result = self.model_runner.execute(plan, sample_seqs, prompt_specs, pooling_specs)
        except Exception as exc:  # a fault in one step fails that step's requests, not the server
            if self.model_runner.fault is not None:  # unless the tensor-parallel ranks are lost
                raise EngineDeadError(self.model_runner.fault) from exc
            logger.exception("engine step failed; failing the %d requests in it", plan.num_reqs)
            return self.fail_requests(self._request_ids_of(plan), f"engine step failed: {exc}")
        return self.output_processor.process(plan, result)

    def _note_scheduled(self, plan: StepPlan) -> None:
        now = time.monotonic()
        for seq_id in plan.seq_ids.tolist():
            seq = self._seqs[seq_id]
            metrics = seq.request.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
                metrics.num_cached_tokens = self.scheduler.num_cached_tokens(seq_id)
        for seq_id in plan.preempted_seq_ids.tolist():
            preempted = self._seqs.get(seq_id)
            if preempted is not None:
                preempted.request.metrics.num_preemptions += 1

    def fail_requests(self, request_ids: list[str], message: str) -> list[RequestOutput]:
        """Ends these requests with finish_reason 'error', frees their pages."""
        outputs = []
        for request_id in request_ids:
            request = self._requests.get(request_id)
            if request is None:
                continue
            self._finished_reasons["error"] += _num_unfinished(request)
            self._drop(request_id)
            for seq in request.seqs:
                if not seq.finished:
                    seq.pending().finish_reason = seq.finish_reason = "error"
            output = RequestOutput(
                request_id,
                request.prompt_token_ids,
                [d for d in (s.take_delta() for s in request.seqs) if d is not None],
                finished=True,
                metrics=request.metrics,
                error=message,
            )
            outputs.append(output)
        return outputs

    def _request_ids_of(self, plan: StepPlan) -> list[str]:
        ids = {self._seqs[s].request.request_id for s in plan.seq_ids.tolist() if s in self._seqs}
        return sorted(ids)

    def all_request_ids(self) -> list[str]:
        return list(self._requests)


_PREFILL_ONLY = SamplingParams(max_tokens=1, temperature=0.0)


def _speculator(config: EngineConfig, parts: EngineParts) -> Speculator | None:
    spec = config.speculative
    if spec.speculative_method is None:
        return None
    runner = parts.model_runner
    draft = runner.propose_drafts if spec.speculative_method == "draft" else None
    return Speculator(spec, parts.scheduler.propose, _grammar_prefix, draft)


def _releaser(runner: ModelRunner, speculator: Speculator | None) -> Callable[[int], None]:
    """release(seq_id), for a sequence that is done: drops what the model runner and the
    speculator keep for it. Not a method of the engine: the output processor holds it, and a
    reference back to the engine would make a cycle that keeps a dropped engine's weights and KV
    cache until the cyclic garbage collector happens to run."""

    def release(seq_id: int) -> None:
        runner.release(seq_id)
        if speculator is not None:
            speculator.release(seq_id)

    return release


def _grammar_prefix(seq: Sequence, draft: list[int]) -> list[int]:
    """The part of a draft that the sequence's grammar accepts (structured output)."""
    assert seq.grammar is not None
    return draft[: seq.grammar.valid_prefix(draft)]


def _num_unfinished(request: Request) -> int:
    """Outputs of the request still running, the n > 1 children not yet added included."""
    return request.params.n - sum(1 for seq in request.seqs if seq.finished)
