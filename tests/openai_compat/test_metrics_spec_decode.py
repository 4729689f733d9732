"""/metrics carries vLLM's speculative decoding counters when it is on, and none when off."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest

from pagedserve.core.outputs import EngineStats, SpecDecodeStats
from pagedserve.openai_compat.common.metrics import EngineStatsCollector
from tests.openai_compat.fake_engine import FakeEngine


@dataclass
class _Engine:
    model_info: object
    spec: SpecDecodeStats | None

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 8, 16, 8, 0, 0, 0, 0, 0, spec_decode=self.spec)


def _scrape(spec: SpecDecodeStats | None) -> str:
    engine = _Engine(FakeEngine().model_info, spec)
    registry = CollectorRegistry()
    registry.register(EngineStatsCollector(lambda: engine, "m"))
    return generate_latest(registry).decode()


def test_spec_decode_counters_under_vllm_names() -> None:
    text = _scrape(SpecDecodeStats(5, 17, 9, [5, 3, 1, 0]))
    assert 'vllm:spec_decode_num_drafts_total{model_name="m"} 5.0' in text
    assert 'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 17.0' in text
    assert 'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 9.0' in text
    per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert f'{per_pos}{{model_name="m",position="0"}} 5.0' in text
    assert f'{per_pos}{{model_name="m",position="3"}} 0.0' in text


def test_no_spec_decode_series_when_off() -> None:
    assert "spec_decode" not in _scrape(None)
