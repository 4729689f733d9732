"""Prometheus metrics with vLLM's names, so existing dashboards and the Gateway API Inference
Extension's endpoint picker read pagedserve unchanged.

Each app owns its CollectorRegistry (no global state). Gauges and the engine's own counters are
read from `engine.stats()` at scrape time by a custom collector, among them the finished
requests by reason and the generated tokens: the engine counts every way a request ends,
`abort` (its client left) included, as vLLM reports them. Prompt tokens and latency histograms
are recorded by the serving layer when it sees a request finish.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from functools import partial
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pagedserve.core.engine_client import EngineClient
from pagedserve.core.outputs import EngineStats, RequestMetrics, SpecDecodeStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip


class EngineStatsCollector(Collector):
    """Gauges and counters the engine keeps itself, read when Prometheus scrapes."""

    def __init__(self, get_engine: Callable[[], EngineClient | None], model_name: str) -> None:
        self._get_engine = get_engine
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        engine = self._get_engine()
        if engine is None:
            return
        stats = engine.stats()
        yield from self._gauges(stats)
        if stats.spec_decode is not None:
            yield from self._spec_decode(stats.spec_decode)
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "KV cache configuration (block_size is the page size).",
            labels=["block_size", "num_gpu_blocks", "model_name"],
        )
        model = engine.model_info
        info.add_metric([str(model.page_size), str(model.num_pages), self._model_name], 1.0)
        yield info

    def _family(
        self,
        kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
        name: str,
        doc: str,
        value: float,
    ) -> Metric:
        family = kind(name, doc, labels=["model_name"])
        family.add_metric([self._model_name], value)
        return family

    def _gauges(self, stats: EngineStats) -> Iterator[Metric]:
        gauge = partial(self._family, GaugeMetricFamily)
        counter = partial(self._family, CounterMetricFamily)
        yield gauge(
            "vllm:num_requests_running", "Requests in the running batch.", stats.num_running
        )
        yield gauge("vllm:num_requests_waiting", "Requests waiting for a seat.", stats.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = full).", stats.kv_cache_usage)
        yield gauge("pagedserve:kv_pages_used", "KV pages held by requests.", stats.num_used_pages)
        yield gauge("pagedserve:kv_pages_free", "KV pages free.", stats.num_free_pages)
        yield gauge(
            "pagedserve:kv_pages_cached",
            "Free pages kept for prefix reuse.",
            stats.num_cached_pages,
        )
        yield counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
            stats.prefix_query_tokens,
        )  # fmt: skip
        yield counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
            stats.prefix_hit_tokens,
        )  # fmt: skip
        yield counter(
            "vllm:num_preemptions", "Preemptions of running requests.", stats.num_preemptions
        )
        yield counter(
            "vllm:generation_tokens", "Tokens generated (by aborted requests too).",
            stats.num_generated_tokens,
        )  # fmt: skip
        success = CounterMetricFamily(
            "vllm:request_success", "Ended requests (each of n outputs) by finish reason.",
            labels=["model_name", "finished_reason"],
        )  # fmt: skip
        for reason, count in sorted(stats.finished_reasons.items()):
            success.add_metric([self._model_name, reason], count)
        yield success

    def _spec_decode(self, stats: SpecDecodeStats) -> Iterator[Metric]:
        """vLLM's speculative decoding counters (only while it is on)."""
        counter = partial(self._family, CounterMetricFamily)
        yield counter(
            "vllm:spec_decode_num_drafts", "Verification chunks (drafts) run.", stats.num_drafts
        )
        yield counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens proposed and verified.",
            stats.num_draft_tokens,
        )  # fmt: skip
        yield counter(
            "vllm:spec_decode_num_accepted_tokens", "Draft tokens the target accepted.",
            stats.num_accepted_tokens,
        )  # fmt: skip
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Drafts whose token at this position (0 = first) was accepted.",
            labels=["model_name", "position"],
        )
        for position, count in enumerate(stats.accepted_per_pos):
            per_pos.add_metric([self._model_name, str(position)], count)
        yield per_pos


class StoreSize(Protocol):
    """What the collector reads of /v1/responses' store (responses/store.py's `ResponseStore`),
    named here so that common/ imports no endpoint."""

    def __len__(self) -> int: ...

    @property
    def num_bytes(self) -> int: ...

    @property
    def num_evicted(self) -> int: ...


class ResponseStoreCollector(Collector):
    """How full the /v1/responses store is, read when Prometheus scrapes."""

    def __init__(self, store: StoreSize, model_name: str) -> None:
        self._store = store
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        store = self._store
        for kind, name, doc, value in (
            (GaugeMetricFamily, "pagedserve:responses_stored", "Responses kept.", len(store)),
            (GaugeMetricFamily, "pagedserve:responses_stored_bytes",
             "JSON bytes the stored responses reference.", store.num_bytes),
            (CounterMetricFamily, "pagedserve:responses_evicted",
             "Stored responses evicted by the store's bounds.", store.num_evicted),
        ):  # fmt: skip
            family = kind(name, doc, labels=["model_name"])
            family.add_metric([self._model_name], value)
            yield family


class ModelsCollector(Collector):
    """Each loaded model's EngineStatsCollector, their families merged by name: a server with
    several models (issue 39) writes each family once, one sample per `model_name`."""

    def __init__(self) -> None:
        self.collectors: dict[str, Collector] = {}

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for collector in list(self.collectors.values()):
            for family in collector.collect():
                held = merged.setdefault(family.name, family)
                if held is not family:
                    held.samples.extend(family.samples)
        yield from merged.values()


class ServerMetrics:
    """The app's registry plus the per-request series it records, labelled by `model_name`;
    `for_model` gives another model's view of the same registry."""

    def __init__(self, model_name: str, get_engine: Callable[[], EngineClient | None]) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.models = ModelsCollector()
        self.models.collectors[model_name] = EngineStatsCollector(get_engine, model_name)
        self.registry.register(self.models)
        reg = self.registry
        label = ["model_name"]
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens processed.", label, registry=reg
        )
        self.embedding_requests = Counter(
            "pagedserve:embedding_requests", "Valid requests to /v1/embeddings.", label,
            registry=reg,
        )  # fmt: skip
        self.embedding_inputs = Counter(
            "pagedserve:embedding_inputs", "Inputs (engine requests) of /v1/embeddings; their "
            "prompt tokens count in vllm:prompt_tokens.", label, registry=reg,
        )  # fmt: skip
        self.ttft = self._histogram("vllm:time_to_first_token_seconds", "Time to first token.")
        self.itl = self._histogram("vllm:inter_token_latency_seconds", "Time between tokens.")
        self.e2e = self._histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.")
        self.queue = self._histogram("vllm:request_queue_time_seconds", "Time waiting for a seat.")

    def _histogram(self, name: str, doc: str) -> Histogram:
        return Histogram(
            name, doc, ["model_name"], buckets=_LATENCY_BUCKETS, registry=self.registry
        )

    def record(self, metrics: RequestMetrics | None) -> None:
        """Record one finished engine request (the engine counts its outputs and tokens)."""
        model = self.model_name
        if metrics is None:
            return
        self.prompt_tokens.labels(model).inc(metrics.num_prompt_tokens)
        if metrics.time_to_first_token is not None:
            self.ttft.labels(model).observe(metrics.time_to_first_token)
        if metrics.queue_time is not None:
            self.queue.labels(model).observe(metrics.queue_time)
        if metrics.finished_time is not None:
            self.e2e.labels(model).observe(metrics.finished_time - metrics.arrival_time)
        itl = self.itl.labels(model)
        for latency in metrics.inter_token_latencies:
            itl.observe(latency)

    def record_embedding_request(self, num_inputs: int) -> None:
        self.embedding_requests.labels(self.model_name).inc()
        self.embedding_inputs.labels(self.model_name).inc(num_inputs)

    def for_model(
        self, model_name: str, get_engine: Callable[[], EngineClient | None]
    ) -> ServerMetrics:
        """The same registry and series recording under `model_name`, its engine's gauges
        collected until `forget_model`."""
        view = copy.copy(self)
        view.model_name = model_name
        self.models.collectors[model_name] = EngineStatsCollector(get_engine, model_name)
        return view

    def forget_model(self, model_name: str) -> None:
        """Its engine is gone: its gauges leave /metrics (its counters stay)."""
        self.models.collectors.pop(model_name, None)

    def watch_response_store(self, store: StoreSize) -> None:
        self.registry.register(ResponseStoreCollector(store, self.model_name))

    def render(self) -> bytes:
        return generate_latest(self.registry)
