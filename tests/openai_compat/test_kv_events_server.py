"""KV events from a real `pagedserve serve` process (--kv-events-config), read as a router
reads them: its ZeroMQ SUB binds on loopback and the server's PUB connects to it (llm-d's
centralized mode), gaps are filled from the replay socket, and the index is keyed by
(adapter, hash) as the prefix cache is. While the OpenAI SDK sends requests that share
prefixes, for the base model and an adapter, in a cache small enough to evict, the index must
say what the server's cache holds: the replay from sequence 0 rebuilds the same index, and a
prompt's hit (usage's cached_tokens, /metrics' prefix cache hits) is the prefix of full pages
the index holds for that prompt and adapter; the server runs under --served-model-name, and
the topic of each batch read live names the model by it. A --models-dir server publishes each
model on its own sockets, under its own topic (the model's name in the catalog)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import openai
import pytest
import zmq

from bench.common.server import API_KEY, Server, free_port, start_server, stop_server
from bench.common.tiny_lora import ATTENTION, write_peft_adapter
from bench.common.tiny_models import make_hf_model
from bench.common.tiny_tokenizers import write_tiny_bpe
from tests.core.test_kv_events import replay_batches

pytest.importorskip("peft")
PAGE_SIZE = 16
TOPIC = "kv@127.0.0.1@"  # llm-d's kv@<pod>@<model>: the server fills in {model}
SERVED = "tiny-llama"  # --served-model-name: the name clients send, and {model} in the topic
QUIET_S = 0.6  # no batch for this long after the last response: the server has published all


@dataclass
class Router:
    """One replica's cached prefixes from its events: (lora_name, hash) -> (parent, tokens)."""

    pages: dict[tuple[str | None, int], tuple[int | None, list[int]]] = field(default_factory=dict)
    next_seq: int = 0
    num_stored: int = 0
    num_removed: int = 0
    adapters: set[str | None] = field(default_factory=set)

    def apply(self, seq: int, payload: bytes) -> None:
        if seq < self.next_seq:
            return
        assert seq == self.next_seq, f"gap: batch {seq} after {self.next_seq - 1}"
        _, events, _ = msgpack.unpackb(payload)
        for event in events:
            self._event(event)
        self.next_seq = seq + 1

    def _event(self, event: list[Any]) -> None:
        if event[0] == "AllBlocksCleared":
            self.pages.clear()
        elif event[0] == "BlockRemoved":
            for h in event[1]:
                key = next(k for k in self.pages if k[1] == h)  # a removal names a held page
                del self.pages[key]
            self.num_removed += len(event[1])
        else:
            _, hashes, parent, tokens, block_size, lora_id, medium, lora_name = event
            assert block_size == PAGE_SIZE and medium == "CPU"
            assert (lora_id is None) == (lora_name is None)
            self.adapters.add(lora_name)
            for i, h in enumerate(hashes):
                assert parent is None or (lora_name, parent) in self.pages
                self.pages[lora_name, h] = (parent, tokens[i * PAGE_SIZE : (i + 1) * PAGE_SIZE])
                parent = h
            self.num_stored += len(hashes)

    def cached_tokens(self, lora_name: str | None, prompt: list[int]) -> int:
        """What the index says a prompt finds cached: its full pages (all but its last token's
        page) chained from a root of that adapter."""
        parent: int | None = None
        for i in range((len(prompt) - 1) // PAGE_SIZE):
            page = prompt[i * PAGE_SIZE : (i + 1) * PAGE_SIZE]
            found = [h for (name, h), (p, tokens) in self.pages.items()
                     if name == lora_name and p == parent and tokens == page]  # fmt: skip
            parent = found[0] if found else None
            if parent is None:
                return i * PAGE_SIZE
        return (len(prompt) - 1) // PAGE_SIZE * PAGE_SIZE

    def chains(self, lora_name: str | None) -> list[list[int]]:
        """The token ids of that adapter's chains walkable from a root to a leaf, longest first."""
        parents = {(name, p) for (name, _), (p, _) in self.pages.items()}
        out = []
        for name, h in self.pages:
            if name != lora_name or (name, h) in parents:
                continue
            tokens: list[int] = []
            cursor: int | None = h
            while cursor is not None and (name, cursor) in self.pages:
                cursor, page = self.pages[name, cursor]
                tokens = page + tokens
            if cursor is None:
                out.append(tokens)
        return sorted(out, key=len, reverse=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("kv-events-server")
    base = root / "base"
    write_tiny_bpe(base)
    model = make_hf_model("llama", seed=3, vocab_size=len(AutoTokenizer.from_pretrained(base)))
    model.save_pretrained(base, safe_serialization=True)
    write_peft_adapter(model, root / "attn", r=8, targets=ATTENTION, seed=1)
    return root


@pytest.fixture(scope="module")
def sockets() -> Iterator[tuple[zmq.Socket, str]]:
    """The router's SUB, bound before the server starts (the server's PUB connects), and its
    address."""
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    port = free_port()
    sub.bind(f"tcp://127.0.0.1:{port}")
    yield sub, f"tcp://127.0.0.1:{port}"
    sub.close(linger=0)


@pytest.fixture(scope="module")
def replay() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    model_dir: Path,
    sockets: tuple[zmq.Socket, str],
    replay: str,
) -> Iterator[Server]:
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": sockets[1],
              "replay_endpoint": replay, "topic": TOPIC + "{model}"}  # fmt: skip
    flags = [str(model_dir / "base"), "--served-model-name", SERVED,
             "--lora-modules", f"attn={model_dir / 'attn'}", "--api-key", API_KEY,
             "--dtype", "float32", "--quantization", "none", "--max-model-len", "128",
             "--num-pages", "14", "--max-num-seqs", "3",
             "--kv-events-config", json.dumps(events)]  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("server"), *flags)
    yield srv
    assert stop_server(srv) == 0, srv.log()


def _sync(router: Router, sub: zmq.Socket, server: Server, replay: str) -> int:
    """Read live batches until the server has been quiet for QUIET_S, filling any gap (the
    first batches go out before the PUB has connected) and the tail from the replay socket;
    returns how many were read live. Each live batch's topic names the model as clients name
    it (--served-model-name)."""
    num_live = 0
    while sub.poll(QUIET_S * 1000):
        topic, seq_bytes, payload = sub.recv_multipart()
        assert server.model == SERVED and topic.decode() == TOPIC + SERVED
        num_live += 1
        seq = int.from_bytes(seq_bytes, "big")
        if seq > router.next_seq:
            for old, old_payload in replay_batches(replay, router.next_seq):
                if old < seq:
                    router.apply(old, old_payload)
        router.apply(seq, payload)
    for seq, payload in replay_batches(replay, router.next_seq):
        router.apply(seq, payload)
    return num_live


def _prompts(server: Server) -> list[tuple[str, str]]:
    """(model, prompt) pairs sharing a system prefix, some for the adapter, more than 14 pages
    of the cache hold at once."""
    system = "You are a careful assistant. Answer in one short paragraph, plainly. "
    topics = ["the red fox", "a blue lake", "green hills", "the old tower", "a quiet town"]
    return [(("attn" if i % 3 == 2 else server.model), f"{system}Tell me about {topic}, part {i}.")
            for i, topic in enumerate(topics * 3)]  # fmt: skip


def test_a_router_index_from_the_events_is_the_servers_cache(
    server: Server, sockets: tuple[zmq.Socket, str], replay: str
) -> None:
    sub = sockets[0]
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    router = Router()

    def complete(model: str, prompt: str) -> openai.types.Completion:
        return client.completions.create(model=model, prompt=prompt, max_tokens=8)

    with ThreadPoolExecutor(3) as pool:  # 3 at once in 14 pages: evictions
        list(pool.map(lambda pair: complete(*pair), _prompts(server)))
    num_live = _sync(router, sub, server, replay)
    assert router.num_removed > 0 and router.num_stored > 14  # it evicted
    assert router.adapters == {None, "attn"}
    # The system prompt's first page is cached twice: once per adapter, under other hashes.
    base_roots, adapter_roots = _roots(router, None), _roots(router, "attn")
    shared = set(base_roots) & set(adapter_roots)
    assert shared and all(base_roots[t] != adapter_roots[t] for t in shared)
    # The replay from 0 rebuilds the same index.
    fresh = Router()
    for seq, payload in replay_batches(replay, 0):
        fresh.apply(seq, payload)
    assert fresh.pages == router.pages and fresh.next_seq == router.next_seq
    # A prompt finds cached what the index holds for it, and only for its own adapter.
    base, adapted = router.chains(None), router.chains("attn")
    assert base and adapted
    probes = [(None, base[0]), ("attn", adapted[0]), (None, base[-1]), ("attn", adapted[-1]),
              ("attn", base[0]), (None, adapted[0])]  # fmt: skip
    hits = []
    for lora_name, tokens in probes:
        num_live += _sync(router, sub, server, replay)
        prompt = tokens + [tokens[0]]
        expected = router.cached_tokens(lora_name, prompt)
        hits_before = server.metric("vllm:prefix_cache_hits_total")
        usage = client.completions.create(model=lora_name or server.model, prompt=prompt,
                                          max_tokens=1).usage  # fmt: skip
        assert usage is not None and usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == expected, (lora_name, len(tokens))
        deadline = time.monotonic() + 5  # the gauge is the engine's snapshot after a step
        while server.metric("vllm:prefix_cache_hits_total") - hits_before < expected:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert server.metric("vllm:prefix_cache_hits_total") - hits_before == expected
        hits.append(expected)
    # Batches were read live, each under the topic that names the model as clients do. (The
    # first ones may all come from the replay: libzmq attaches a connecting PUB to a bound SUB
    # only once the SUB is polled.)
    assert num_live > 0
    assert hits[0] == len(base[0]) > 0  # the index's chain, whole, found where it said
    assert hits[1] > 0
    # Under the other adapter only the shared system prompt's pages are found, not the chain.
    assert hits[4] < len(base[0]) and hits[5] < len(adapted[0])


def _roots(router: Router, lora_name: str | None) -> dict[tuple[int, ...], int]:
    return {tuple(tokens): h for (name, h), (parent, tokens) in router.pages.items()
            if name == lora_name and parent is None}  # fmt: skip


@pytest.fixture(scope="module")
def pool_server(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Server]:
    """Two models (--models-dir) that publish: each binds its own ipc names."""
    root = tmp_path_factory.mktemp("kv-pool")
    for name in ("alpha", "beta"):
        shutil.copytree(model_dir / "base", root / "models" / name)
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{root}/kv",
              "replay_endpoint": f"ipc://{root}/replay", "topic": TOPIC + "{model}"}  # fmt: skip
    flags = ["--models-dir", str(root / "models"), "--api-key", API_KEY, "--dtype", "float32",
             "--quantization", "none", "--max-model-len", "128", "--num-pages", "14",
             "--kv-events-config", json.dumps(events)]  # fmt: skip
    srv = start_server(root, *flags)
    yield srv
    assert stop_server(srv) == 0, srv.log()


def test_each_model_of_a_pool_publishes_on_its_own_sockets(pool_server: Server) -> None:
    """alpha (first in /v1/models) binds the configured names, beta the names + _1; each topic
    names its model, and each replay holds only its own model's pages (the two models are
    copies of one, so only the sockets tell them apart)."""
    client = openai.OpenAI(base_url=pool_server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    root = pool_server.log_path.parent
    suffixes = {"alpha": "", "beta": "_1"}
    prompts = {"alpha": list(range(20, 60)), "beta": list(range(100, 140))}
    ctx = zmq.Context.instance()
    subs = {}
    for name, suffix in suffixes.items():
        subs[name] = ctx.socket(zmq.SUB)
        subs[name].setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        subs[name].connect(f"ipc://{root}/kv{suffix}")
    rounds: dict[str, list[int]] = {name: [0] for name in prompts}
    try:
        for name, prompt in prompts.items():  # loads the model: its PUB binds meanwhile
            client.completions.create(model=name, prompt=[0, *prompt], max_tokens=4)
        for name, sub in subs.items():  # new pages (a new first token) until one is read live
            while not sub.poll(500):
                assert len(rounds[name]) < 20, f"{name}: no live batch"
                rounds[name].append(len(rounds[name]))
                prompt = [rounds[name][-1], *prompts[name]]
                client.completions.create(model=name, prompt=prompt, max_tokens=4)
            topic, _, _ = sub.recv_multipart()
            assert topic.decode() == TOPIC + name
    finally:
        for sub in subs.values():
            sub.close(linger=0)
    for name, suffix in suffixes.items():
        assert f"KV events of {name}: bound at ipc://{root}/kv{suffix}" in pool_server.log()
        router = Router()
        for seq, payload in replay_batches(f"ipc://{root}/replay{suffix}", 0):
            router.apply(seq, payload)
        own = {tuple([r, *prompts[name]][:PAGE_SIZE]) for r in rounds[name]}
        assert _roots(router, None) and set(_roots(router, None)) <= own, name
