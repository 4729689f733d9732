"""LLM: offline batched generation, `from pagedserve import LLM, SamplingParams`."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from pagedserve.core.config import (
    CacheConfig,
    EngineConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from pagedserve.core.engine.llm_engine import LLMEngine
from pagedserve.core.lora_request import LoRARequest
from pagedserve.core.outputs import RequestOutput
from pagedserve.core.pooling_params import PoolingParams
from pagedserve.core.sampling_params import SamplingParams

Prompt = str | Sequence[int]


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _split_kwargs(kwargs: dict[str, Any]) -> EngineConfig:
    """Route each keyword to the config that owns the field; unknown keywords are an error."""
    parts: dict[type, dict[str, Any]] = {
        cls: {}
        for cls in (
            ModelConfig,
            CacheConfig,
            SchedulerConfig,
            ParallelConfig,
            SpeculativeConfig,
            LoRAConfig,
        )
    }
    for key, value in kwargs.items():
        owner = next((cls for cls in parts if key in _field_names(cls)), None)
        if owner is None:
            raise TypeError(f"LLM() got an unexpected keyword argument {key!r}")
        parts[owner][key] = value
    return EngineConfig(
        model=ModelConfig(**parts[ModelConfig]),
        cache=CacheConfig(**parts[CacheConfig]),
        scheduler=SchedulerConfig(**parts[SchedulerConfig]),
        parallel=ParallelConfig(**parts[ParallelConfig]),
        speculative=SpeculativeConfig(**parts[SpeculativeConfig]),
        lora=LoRAConfig(**parts[LoRAConfig]),
    )


class LLM:
    """Offline engine. Keywords are the fields of ModelConfig, CacheConfig, SchedulerConfig,
    ParallelConfig and SpeculativeConfig (tensor_parallel_size=2 starts a worker process:
    close() stops it).

    >>> llm = LLM(dtype="float32")                      # the bundled SmolLM2-135M-Instruct
    >>> llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text
    """

    def __init__(self, model: str = "", **kwargs: Any) -> None:
        self.engine = LLMEngine.from_config(_split_kwargs({"model": model, **kwargs}))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (they also end with this process)."""
        self.engine.close()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Runs every prompt to completion; outputs come back whole, in prompt order.
        lora_request: the adapter (one, or one per prompt; None: the base model), loaded from
        its lora_path the first time its name is seen (vLLM's offline LoRARequest)."""
        prompt_list = self._as_list(prompts)
        params = sampling_params or SamplingParams()
        params_list = (
            [params] * len(prompt_list) if isinstance(params, SamplingParams) else list(params)
        )
        if len(params_list) != len(prompt_list):
            raise ValueError("sampling_params: give one, or one per prompt")
        loras = [self._lora(r) for r in _per_prompt(lora_request, len(prompt_list))]
        return self._run(self._add_all(prompt_list, params_list, loras), use_tqdm)

    def _lora(self, request: LoRARequest | None) -> LoRARequest | None:
        """The loaded adapter of request's name (loaded now from its path if it is not)."""
        if request is None:
            return None
        for loaded in self.engine.list_loras():
            if loaded.lora_name == request.lora_name:
                return loaded
        return self.engine.add_lora(request.lora_name, request.lora_path)

    def embed(
        self,
        inputs: Prompt | Sequence[Prompt],
        *,
        dimensions: int | None = None,
        use_tqdm: bool = False,
    ) -> list[list[float]]:
        """The embedding of every input (texts are tokenized with the model's special tokens,
        as sentence-transformers does), in input order; needs an embedding model (task
        embed). The requests batch like any others."""
        input_list = self._as_list(inputs)
        params = [PoolingParams(dimensions=dimensions)] * len(input_list)
        outputs = self._run(self._add_all(input_list, params), use_tqdm)
        return [o.embedding for o in outputs if o.embedding is not None]

    def score(self, query: str, documents: Sequence[str], *, use_tqdm: bool = False) -> list[float]:
        """Each document's relevance to the query, in order (task score: the reranker's
        template, softmax([logit(no), logit(yes)])[1] at the last position); the documents
        batch, and share the query's prefix pages."""
        pooler = self.engine.pooler
        if pooler is None or pooler.score is None:
            raise ValueError("this model is not a reranker: load it with task='score'")
        prompts: list[Prompt] = [pooler.score.render(query, d) for d in documents]
        return [vector[0] for vector in self.embed(prompts, use_tqdm=use_tqdm)]

    def _add_all(
        self,
        prompts: list[Prompt],
        params: Sequence[SamplingParams | PoolingParams],
        loras: Sequence[LoRARequest | None] | None = None,
    ) -> list[str]:
        ids = []
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            request_id = f"offline-{next(self._ids)}"
            token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            lora = loras[i] if loras else None
            self.engine.add_request(request_id, token_ids, p, lora_request=lora)
            ids.append(request_id)
        return ids

    def chat(
        self,
        messages: list[dict[str, Any]],
        sampling_params: SamplingParams | None = None,
    ) -> RequestOutput:
        template = self.engine.chat_template
        if template is None:
            raise ValueError("this model has no chat template; pass chat_template=<path>")
        prompt = template.render(messages, add_generation_prompt=True)
        token_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        return self.generate([token_ids], sampling_params)[0]

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), disable=not use_tqdm, desc="generate")
        while self.engine.has_unfinished():
            for delta in self.engine.step():
                if delta.request_id in done:
                    done[delta.request_id].merge(delta)
                else:
                    done[delta.request_id] = delta
                if delta.finished:
                    bar.update(1)
        bar.close()
        return [done[i] for i in ids]

    @staticmethod
    def _as_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
        if isinstance(prompts, str):
            return [prompts]
        if prompts and isinstance(prompts[0], int):
            return [prompts]  # type: ignore[list-item]
        return list(prompts)  # type: ignore[arg-type]


def _per_prompt(
    lora_request: LoRARequest | Sequence[LoRARequest | None] | None, num_prompts: int
) -> list[LoRARequest | None]:
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    if len(lora_request) != num_prompts:
        raise ValueError("lora_request: give one, or one per prompt")
    return list(lora_request)
