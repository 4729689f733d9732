"""KV events (--kv-events-config): a real ZeroMQ subscriber, written as a router's would be
(llm-d's and Dynamo's decode vLLM's msgpack arrays), rebuilds the replica's cached-prefix index
from the events and must hold exactly the allocator's cache after every step of a storm of
requests in a small KV cache (evictions and preemptions), and again from the replay socket.
Stored pages name their LoRA adapter (the salt the native allocator's log records with each
page), and a several-model server gives each model its own sockets or refuses to start."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from pagedserve import _core as core
from pagedserve import cli
from pagedserve.core.config import (
    CacheConfig,
    EngineConfig,
    KVEventsConfig,
    LoRAConfig,
    ModelConfig,
    SchedulerConfig,
)
from pagedserve.core.engine.kv_events import PageAdapters, to_events
from pagedserve.core.engine.llm_engine import LLMEngine
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.sampling_params import SamplingParams
from pagedserve.core.sched.scheduler import KvEventRecords
from pagedserve.openai_compat.model_catalog import check_kv_events_addresses

PAGE_SIZE = 16
TOPIC = b"kv@replica-0"
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def page_hash(parent_hash: int, token_ids: list[int]) -> int:
    """The oracle of the allocator's chained page hash (`hash_page` in
    cpp/src/page_allocator.cpp), in Python: a first page's hash is page_hash(salt, its tokens),
    so a router's copy can check which salt a chain was seeded with."""

    def finalize(h: int) -> int:  # splitmix64's finalizer, as the C++ one
        h ^= h >> 30
        h = (h * 0xBF58476D1CE4E5B9) & _MASK64
        h ^= h >> 27
        h = (h * 0x94D049BB133111EB) & _MASK64
        return h ^ (h >> 31)

    h = finalize((parent_hash + _GOLDEN) & _MASK64)
    for token in token_ids:
        h = ((h ^ (token & 0xFFFFFFFF)) * _GOLDEN) & _MASK64
        h ^= h >> 29
    return finalize(h)


@pytest.fixture(scope="module")
def engine(default_model: ResolvedModel) -> Iterator[LLMEngine]:
    events = KVEventsConfig(
        enable_kv_cache_events=True, publisher="zmq", endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*", topic=TOPIC.decode(),
    )  # fmt: skip
    config = EngineConfig(
        model=ModelConfig(model=str(default_model.path), max_model_len=128),
        # 8 pages of 16 tokens for 4 sequences of ~50 tokens: evictions and preemptions.
        cache=CacheConfig(num_pages=8, page_size=PAGE_SIZE),
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64),
        kv_events=events,
    )
    llm = LLMEngine.from_config(config)
    yield llm
    llm.close()


@dataclass
class Subscriber:
    """A router's view of one replica: hash -> (parent hash, token ids), from the events."""

    blocks: dict[int, tuple[int | None, list[int]]] = field(default_factory=dict)
    next_seq: int = 0
    num_stored: int = 0
    num_removed: int = 0

    def apply(self, seq: int, payload: bytes) -> None:
        if seq < self.next_seq:
            return  # already applied (a replayed batch also seen live)
        assert seq == self.next_seq, f"gap: batch {seq} after {self.next_seq - 1}"
        ts, events, dp_rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and dp_rank == 0
        for event in events:
            self._event(event)
        self.next_seq = seq + 1

    def _event(self, event: list[Any]) -> None:
        tag = event[0]
        if tag == "AllBlocksCleared":
            assert event == ["AllBlocksCleared"]
            self.blocks.clear()
        elif tag == "BlockRemoved":
            _, hashes, medium = event
            assert medium == "CPU"
            for h in hashes:
                del self.blocks[h]  # a removal names a page the router holds
            self.num_removed += len(hashes)
        else:
            assert tag == "BlockStored" and len(event) == 8
            _, hashes, parent, tokens, block_size, lora_id, medium, lora_name = event
            assert block_size == PAGE_SIZE and medium == "CPU" and lora_id is lora_name is None
            assert len(tokens) == len(hashes) * block_size
            for i, h in enumerate(hashes):
                assert parent is None or parent in self.blocks, "a parent is stored first"
                self.blocks[h] = (parent, tokens[i * block_size : (i + 1) * block_size])
                parent = h
            self.num_stored += len(hashes)

    def prefix(self, h: int) -> list[int] | None:
        """The tokens from the root to page h, or None where a parent has left the cache."""
        pages: list[list[int]] = []
        cursor: int | None = h
        while cursor is not None:
            if cursor not in self.blocks:
                return None
            cursor, tokens = self.blocks[cursor]
            pages.append(tokens)
        return [t for page in reversed(pages) for t in page]


def _subscribe(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    sub.connect(endpoint)
    return sub


def replay_batches(endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """What a replay socket resends from `start` on: (seq, payload) until its end marker."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        batches = []
        while True:
            assert dealer.poll(5000), "the replay socket did not answer"
            empty, seq_bytes, payload = dealer.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            assert empty == b""
            if seq == -1:
                assert payload == b""
                return batches
            batches.append((seq, payload))
    finally:
        dealer.close(linger=0)


def _catch_up(sub: zmq.Socket, state: Subscriber, ctx: zmq.Context, engine: LLMEngine) -> None:
    """Read live batches until the subscriber has every batch published so far; a gap (the
    first batches, sent before the subscription took) is filled from the replay socket."""
    publisher = engine.kv_events
    assert publisher is not None
    while state.next_seq < publisher.num_queued:
        if not sub.poll(200):
            for seq, payload in replay_batches(str(publisher.replay_endpoint), state.next_seq):
                state.apply(seq, payload)
            continue
        topic, seq_bytes, payload = sub.recv_multipart()
        assert topic == TOPIC
        seq = int.from_bytes(seq_bytes, "big")
        if seq > state.next_seq:
            for old, old_payload in replay_batches(str(publisher.replay_endpoint), state.next_seq):
                if old < seq:
                    state.apply(old, old_payload)
        state.apply(seq, payload)


def _storm(engine: LLMEngine) -> dict[str, list[int]]:
    """Requests sharing prefixes (cache hits), longer than the cache holds at once."""
    tokenizer = engine.tokenizer
    system = "You are a careful assistant who answers in one paragraph. "
    prompts = [
        system + f"Question {i % 3}: describe the colour {['red', 'green', 'blue'][i % 3]}."
        for i in range(4)
    ]
    for i, text in enumerate(prompts):
        params = SamplingParams(temperature=0.8, seed=i, max_tokens=28 + 4 * (i % 3),
                                ignore_eos=True)  # fmt: skip
        engine.add_request(f"storm-{i}", tokenizer.encode(text), params)
    return {f"storm-{i}": tokenizer.encode(text) for i, text in enumerate(prompts)}


def test_a_subscriber_rebuilds_the_cache_after_every_step(engine: LLMEngine) -> None:
    publisher = engine.kv_events
    assert publisher is not None and publisher.endpoint.startswith("tcp://127.0.0.1:")
    ctx = zmq.Context.instance()
    sub = _subscribe(ctx, publisher.endpoint)
    state = Subscriber()
    try:
        prompts = _storm(engine)
        generated: dict[str, list[int]] = {rid: [] for rid in prompts}
        num_steps = 0
        while engine.has_unfinished():
            for out in engine.step():
                generated[out.request_id] += [t for c in out.outputs for t in c.token_ids]
            num_steps += 1
            _catch_up(sub, state, ctx, engine)
            assert set(state.blocks) == set(engine.scheduler.cached_page_hashes()), num_steps
    finally:
        sub.close(linger=0)
    stats = engine.stats()
    assert stats.num_preemptions > 0 and state.num_removed > 0 and state.num_stored > 8
    # Every chain the router can walk from a root spells a prefix of a request's tokens.
    texts = [prompts[rid] + generated[rid] for rid in prompts]
    walked = 0
    for h in state.blocks:
        tokens = state.prefix(h)
        if tokens is not None:
            walked += 1
            assert any(text[: len(tokens)] == tokens for text in texts)
    assert walked > 0


def test_the_replay_socket_resends_from_a_sequence_number(engine: LLMEngine) -> None:
    publisher = engine.kv_events
    assert publisher is not None
    if publisher.num_queued < 3:  # run alone: make some history first
        _storm(engine)
        while engine.has_unfinished():
            engine.step()
    ctx = zmq.Context.instance()
    deadline = time.monotonic() + 5
    while publisher.num_published < publisher.num_queued and time.monotonic() < deadline:
        time.sleep(0.01)
    everything = replay_batches(str(publisher.replay_endpoint), 0)
    assert [seq for seq, _ in everything] == list(range(publisher.num_published))
    state = Subscriber()
    for seq, payload in everything:
        state.apply(seq, payload)
    assert set(state.blocks) == set(engine.scheduler.cached_page_hashes())
    assert msgpack.unpackb(everything[0][1])[1] == [["AllBlocksCleared"]]
    tail = replay_batches(str(publisher.replay_endpoint), 2)
    assert tail == everything[2:]
    # A malformed request is ignored; the socket still answers the next one.
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(str(publisher.replay_endpoint))
    dealer.send_multipart([b"", b"\x01"])
    dealer.close(linger=1000)
    assert replay_batches(str(publisher.replay_endpoint), publisher.num_published) == []


def test_records_become_vllm_events() -> None:
    """Chains of stores are one BlockStored, runs of removals one BlockRemoved, in order."""
    tokens = np.arange(3 * 2, dtype=np.int32).reshape(3, 2)
    records = KvEventRecords(
        kinds=np.array([0, 0, 1, 1, 0], dtype=np.int8),
        hashes=np.array([10, 11, 10, 11, 12], dtype=np.uint64),
        parent_hashes=np.array([0, 10, 0, 0, 2**64 - 1], dtype=np.uint64),
        has_parent=np.array([0, 1, 0, 0, 1], dtype=np.uint8),
        salts=np.zeros(5, dtype=np.uint64),
        token_ids=tokens,
    )
    assert to_events(records, 2, "CPU") == [
        ["BlockStored", [10, 11], None, [0, 1, 2, 3], 2, None, "CPU", None],
        ["BlockRemoved", [10, 11], "CPU"],
        ["BlockStored", [12], 2**64 - 1, [4, 5], 2, None, "CPU", None],
    ]


def test_a_stored_page_is_named_by_its_records_salt() -> None:
    """The adapter comes from the log's salt, not from the page's hash or tokens: a root whose
    hash is the base's hash of its tokens (as a collision would make it) but whose record says
    adapter 5 is adapter 5's; a child of the base's root in one chain but of another salt
    starts an event of its own."""
    row = [3, 4]
    records = KvEventRecords(
        kinds=np.array([0, 0, 0], dtype=np.int8),
        hashes=np.array([page_hash(0, row), 21, 22], dtype=np.uint64),
        parent_hashes=np.array([0, page_hash(0, row), 21], dtype=np.uint64),
        has_parent=np.array([0, 1, 1], dtype=np.uint8),
        salts=np.array([5, 5, 0], dtype=np.uint64),
        token_ids=np.array([row, [5, 6], [7, 8]], dtype=np.int32),
    )
    adapters = PageAdapters()
    adapters.note(5, "attn")
    assert to_events(records, 2, "CPU", adapters) == [
        ["BlockStored", [page_hash(0, row), 21], None, [3, 4, 5, 6], 2, 5, "CPU", "attn"],
        ["BlockStored", [22], 21, [7, 8], 2, None, "CPU", None],
    ]


def test_the_log_records_each_pages_chain_seed() -> None:
    """Every record of a chain carries the salt its root was registered with (a child's own
    salt argument does not count: its hash chains from its parent's), and the hashes are the
    oracle's chain from that salt."""
    allocator = core.PageAllocator(4, 4, True)
    allocator.kv_events.enabled = True
    rows = [[1, 2, 3, 4], [5, -6, 7, 2**31 - 1], [0, 0, 0, 0]]
    pages = allocator.allocate(3)
    assert pages is not None
    parent = -1
    for page, row, salt in zip(pages, rows, (9, 0, 4), strict=True):
        generation = allocator.generation(parent) if parent >= 0 else 0
        allocator.register_page(page, parent, generation, np.array(row, dtype=np.int32), salt)
        parent = page
    records = KvEventRecords(*allocator.kv_events.drain(4))
    expected, h = [], 9
    for row in rows:
        h = page_hash(h, row)
        expected.append(h)
    assert records.hashes.tolist() == expected
    assert records.salts.dtype == np.uint64 and records.salts.tolist() == [9, 9, 9]
    assert records.token_ids.tolist() == rows
    for page in reversed(pages):
        allocator.release(page)
    assert allocator.allocate(4) is not None  # evicts the chain: removals keep the salt
    removed = KvEventRecords(*allocator.kv_events.drain(4))
    assert removed.kinds.tolist() == [KvEventRecords.REMOVED] * 3
    assert sorted(removed.hashes.tolist()) == sorted(expected)
    assert removed.salts.tolist() == [9, 9, 9] and removed.token_ids.shape == (0, 4)


def test_stored_pages_name_their_adapter() -> None:
    """The same tokens cached for the base and for adapter 5: two roots, each BlockStored with
    its adapter's lora_id and lora_name (None for the base); a child inherits its parent's."""
    allocator = core.PageAllocator(4, 2, True)
    allocator.kv_events.enabled = True
    adapters = PageAdapters()
    adapters.note(5, "attn")
    pages = allocator.allocate(4)
    assert pages is not None
    first, second = np.array([7, 8], dtype=np.int32), np.array([9, 10], dtype=np.int32)
    for salt, (root, child) in ((5, pages[:2]), (0, pages[2:])):
        allocator.register_page(root, -1, 0, first, salt)
        allocator.register_page(child, root, allocator.generation(root), second, salt)
    records = KvEventRecords(*allocator.kv_events.drain(2))
    events = to_events(records, 2, "CPU", adapters)
    assert [(e[0], len(e[1]), e[5], e[7]) for e in events] == [
        ("BlockStored", 2, 5, "attn"),
        ("BlockStored", 2, None, None),
    ]
    assert events[0][1][0] != events[1][1][0] and events[0][3] == events[1][3] == [7, 8, 9, 10]
    # Evicted, then the adapter's chain stored again in a later batch: still named.
    for page in pages:
        allocator.release(page)
    fresh = allocator.allocate(4)
    assert fresh is not None
    removed = to_events(KvEventRecords(*allocator.kv_events.drain(2)), 2, "CPU", adapters)
    assert [e[0] for e in removed] == ["BlockRemoved"] and len(removed[0][1]) == 4
    allocator.register_page(fresh[0], -1, 0, first, 5)
    again = to_events(KvEventRecords(*allocator.kv_events.drain(2)), 2, "CPU", adapters)
    allocator.register_page(fresh[1], fresh[0], allocator.generation(fresh[0]), second, 5)
    child = to_events(KvEventRecords(*allocator.kv_events.drain(2)), 2, "CPU", adapters)
    assert again[0][5:] == child[0][5:] == [5, "CPU", "attn"]
    assert child[0][2] == again[0][1][0]


def test_an_engine_names_each_adapters_pages_by_its_id_and_name(tmp_path: Path) -> None:
    """A real engine with a LoRA adapter, loaded, then unloaded and loaded again (a new id),
    and the base model: one prompt for each caches three roots of the same tokens, which only
    their salt tells apart. From the replay socket, each chain is one BlockStored with its
    adapter's lora_id (its LoRARequest.lora_int_id) and lora_name (None for the base), hashed
    from that id (the oracle), and the stored hashes are the allocator's cache."""
    pytest.importorskip("peft")
    from transformers import AutoTokenizer

    from bench.common.tiny_lora import ATTENTION, write_peft_adapter
    from bench.common.tiny_models import make_hf_model
    from bench.common.tiny_tokenizers import write_tiny_bpe

    base = tmp_path / "base"
    write_tiny_bpe(base)
    model = make_hf_model("llama", seed=3, vocab_size=len(AutoTokenizer.from_pretrained(base)))
    model.save_pretrained(base, safe_serialization=True)
    adapter = str(write_peft_adapter(model, tmp_path / "attn", r=8, targets=ATTENTION, seed=1))
    events = KVEventsConfig(
        enable_kv_cache_events=True, publisher="zmq", endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*", topic=TOPIC.decode(),
    )  # fmt: skip
    engine = LLMEngine.from_config(EngineConfig(
        model=ModelConfig(model=str(base), dtype="float32", quantization="none",
                          max_model_len=128),
        cache=CacheConfig(num_pages=32, page_size=PAGE_SIZE),
        lora=LoRAConfig(enable_lora=True),
        kv_events=events,
    ))  # fmt: skip
    try:
        text = "The same words for every adapter, long enough for two full pages. " * 3
        prompt = engine.tokenizer.encode(text)[: 2 * PAGE_SIZE + 5]
        params = SamplingParams(temperature=0, max_tokens=2)
        first = engine.add_lora("attn", adapter)
        engine.add_request("base", prompt, params)
        engine.add_request("first", prompt, params, lora_request=first)
        while engine.has_unfinished():
            engine.step()
        engine.remove_lora("attn")
        second = engine.add_lora("attn", adapter)  # the same name under a new id
        assert first.lora_int_id != second.lora_int_id
        engine.add_request("second", prompt, params, lora_request=second)
        while engine.has_unfinished():
            engine.step()
        cached = set(engine.scheduler.cached_page_hashes())
        publisher = engine.kv_events
        assert publisher is not None
        deadline = time.monotonic() + 5
        while publisher.num_published < publisher.num_queued and time.monotonic() < deadline:
            time.sleep(0.01)
        batches = replay_batches(str(publisher.replay_endpoint), 0)
    finally:
        engine.close()
    stored = [e for _, p in batches for e in msgpack.unpackb(p)[1] if e[0] == "BlockStored"]
    assert not [e for _, p in batches for e in msgpack.unpackb(p)[1] if e[0] == "BlockRemoved"]
    by_adapter = {(e[5], e[7]): e for e in stored}
    assert len(stored) == len(by_adapter) == 3, [(e[5], e[7], len(e[1])) for e in stored]
    assert set(by_adapter) == {(None, None), (first.lora_int_id, "attn"),
                               (second.lora_int_id, "attn")}  # fmt: skip
    roots = set()
    for (lora_id, _), (_, hashes, parent, tokens, block_size, _, medium, _) in by_adapter.items():
        assert parent is None and block_size == PAGE_SIZE and medium == "CPU"
        assert tokens == prompt[: 2 * PAGE_SIZE]
        h = lora_id or 0
        for i, page in enumerate(hashes):
            h = page_hash(h, tokens[i * PAGE_SIZE : (i + 1) * PAGE_SIZE])
            assert page == h, (lora_id, i)
        roots.add(hashes[0])
    assert len(roots) == 3
    assert {h for e in stored for h in e[1]} == cached


def test_each_model_of_a_pool_gets_its_own_sockets() -> None:
    """vLLM's data-parallel rule per model (its place in the catalog): bound tcp ports + index,
    ipc / inproc names + _index, a * port left to the system; `{model}` in the topic."""
    config = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                            endpoint="tcp://*:5557", replay_endpoint="ipc:///tmp/kv-replay",
                            topic="kv@10.0.0.1@{model}")  # fmt: skip
    second = config.for_model(1, "qwen")
    assert (second.endpoint, second.replay_endpoint, second.topic) == (
        "tcp://*:5558", "ipc:///tmp/kv-replay_1", "kv@10.0.0.1@qwen")  # fmt: skip
    assert config.for_model(0, "smol").endpoint == "tcp://*:5557"
    wildcard = replace(config, endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    assert wildcard.for_model(3, "x").endpoint == "tcp://127.0.0.1:*"
    connects = replace(config, endpoint="tcp://router:5557")  # a router's SUB binds
    assert connects.for_model(2, "x").endpoint == "tcp://router:5557"
    check_kv_events_addresses([(n, connects.for_model(i, n)) for i, n in enumerate("abc")])
    with pytest.raises(ValueError, match="model 2's port 65537"):
        replace(config, endpoint="tcp://*:65535").for_model(2, "x")


def test_model_in_the_topic_is_the_served_model_name() -> None:
    """`{model}` is the name clients send: --served-model-name where given (filled from the
    flags), else left for the engine, which fills in the model's own name (the one /v1/models
    then lists)."""
    from pagedserve.cli_args import build_parser, configs_from_args

    def topic(*flags: str) -> str:
        events = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                             "topic": "kv@10.0.0.1@{model}"})  # fmt: skip
        args = build_parser().parse_args(["serve", "m.gguf", "--kv-events-config", events, *flags])
        return configs_from_args(args, {})[1].kv_events.topic

    assert topic("--served-model-name", "smol") == "kv@10.0.0.1@smol"
    assert topic("--served-model-name", "smol", "gpt-4o") == "kv@10.0.0.1@smol"  # the first
    assert topic() == "kv@10.0.0.1@{model}"
    plain = KVEventsConfig(topic="kv")
    assert plain.with_model("smol") == plain


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ({"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"},
         "models 'a' and 'b' would both bind tcp port 5558"),
        ({"endpoint": "tcp://127.0.0.1:5557"},
         "models 'a' and 'b' would both publish to tcp://127.0.0.1:5557 under the topic ''"),
    ],
)  # fmt: skip
def test_two_models_on_one_socket_are_refused_at_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], events: dict[str, str], message: str
) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.gguf").write_bytes(b"")
    flags = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", **events})
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--models-dir", str(tmp_path), "--kv-events-config", flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
