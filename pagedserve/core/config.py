"""Frozen configuration, built once at the edge (cli.py or LLM(...)) and passed down.

Each field carries a docstring right under it; cli.py reuses those as the flags' help text.
Bad values raise ValueError naming the field. This module imports only the stdlib.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
QUANTIZATIONS = ("auto", "none")
QUANTIZED_ACTIVATIONS = ("auto", "int8", "int16", "float")
CPU_LINEARS = ("auto", "native", "amx", "torch")
X86_ISAS = ("portable", "avx2", "avx2_vnni", "avx512", "avx512_bf16", "amx")
"""x86-64's ISA levels, lowest first (what each means: pagedserve/core/ops/cpu_features.py)."""
ARM_ISAS = ("portable", "neon", "neon_dotprod", "neon_i8mm")
"""aarch64's ISA levels, lowest first."""
CPU_ISAS = ("auto", *X86_ISAS, *ARM_ISAS[1:])
"""--cpu-isa's choices: auto (the CPU's best), then every level of either architecture."""
TASKS = ("auto", "generate", "embed", "score")
SPECULATIVE_METHODS = ("ngram", "draft")


@dataclass(frozen=True)
class ModelConfig:
    model: str = ""
    """Model to serve: a local .gguf file, an HF-style folder, or a hub id. Empty: the bundled
    SmolLM2-135M-Instruct."""
    mmproj: str | None = None
    """llama.cpp's multimodal projector GGUF (what its converter writes with --mmproj) for a
    GGUF language model: the vision tower and its image preprocessing are read from it
    (Qwen2.5-VL's, projector type qwen2.5vl_merger, with a qwen2vl language model). An HF
    folder carries its own tower and takes none."""
    dtype: str = "auto"
    """Weights and activations dtype: auto, float32, bfloat16 or float16. auto picks bfloat16 on
    CUDA, on CPUs with AVX-512 BF16 (ISA level avx512_bf16 and up) and, from level avx2, for a
    GGUF whose every linear stays quantized (bf16 storage between layers, fp32 compute in the
    kernels), float32 elsewhere (measured in bench/RESULTS.md)."""
    cpu_isa: str = "auto"
    """ISA level of the native CPU kernels: auto (the best this CPU runs), portable (plain
    loops), avx2 (AVX2 + FMA + F16C), avx2_vnni (+ AVX-VNNI for the int8 kernel, where the CPU
    has it), avx512 (AVX-512 F/BW/VL/DQ, with VNNI for the int8 kernels), avx512_bf16 or amx;
    on aarch64 neon (Advanced SIMD), neon_dotprod (+ SDOT) or neon_i8mm (+ USMMLA, for the
    int8 kernel), the other architecture's levels refused; a level above the CPU's is capped at the CPU's. Every level
    gives the same tokens from the quantized kernels; lower ones are for tests and
    comparisons. Process-wide."""
    device: str = "auto"
    """Device to run on: auto (cuda when available), cpu or cuda."""
    max_model_len: int | None = None
    """Context length (prompt + output tokens) per request. Default: the model's own."""
    chat_template: str | None = None
    """Path to a jinja2 chat template that replaces the model's own."""
    attention_backend: str = "auto"
    """Attention implementation: auto (native kernels), native or torch (slow reference)."""
    seed: int = 0
    """Seeds, once at start-up, the random generator that requests without a `seed` draw
    from: the same requests in the same order (offline, or one at a time) sample the same
    tokens from run to run. A request's own `seed` gives it its own generator."""
    deterministic: bool = True
    """Batch-invariant kernels: a request's greedy (or seeded) tokens do not depend on the
    other requests of a step, the prefill chunking or prefix-cache hits (native CPU kernels;
    CUDA never is). --no-deterministic trades that for a faster decode attention (the cost is
    measured in bench/RESULTS.md)."""

    quantization: str = "auto"
    """GGUF quantized weights: auto keeps the file's quantization (Q4_0, Q4_1, Q8_0, Q4_K,
    Q5_K, Q6_K) on the native int8 kernels of a CPU, dequantizing only types without a kernel;
    none dequantizes every weight to the compute dtype."""

    quantized_activations: str = "auto"
    """What the weights kept quantized multiply: int8 rounds each activation row to int8 per 32
    features, as llama.cpp does (fastest); int16 rounds it to int16 per 32 features on the same
    kernels (twice their multiplies); float keeps the activations in fp32 against the weights
    dequantized in registers (the dequantized model's own products, about 2-3x the linears'
    time on AVX2). auto: int16 for a model under 1B parameters whose every linear stays
    quantized on the CPU, else int8 (device_policy.resolve_quantized_activations says why).
    With int16 or float, --dtype auto is float32."""

    cpu_linear: str = "auto"
    """Dense bf16/fp32 linear layers on the CPU: native (the packed kernel at every row
    count: AVX512-BF16, or AVX2 FMAs from ISA level avx2 up; below it torch), amx (the same kernel on AMX-BF16 tiles at every row count; bf16 on a CPU
    with AMX), torch (torch's matmul, oneDNN, AMX where the CPU has it, at every row count; not
    batch-invariant, so it needs --no-deterministic) or auto: a start-up calibration over the
    model's own layer shapes picks, by a step's row count, the fastest; with --deterministic
    batched steps stay on the native kernel (AMX tiles at every row count where they pay) and
    the log says what the rest would gain. GGUF weights kept quantized always run their native
    kernels."""

    task: str = "auto"
    """What the model serves: generate (chat and completions) or embed (/v1/embeddings:
    decoder-only embedders pooled as sentence-transformers' files or the GGUF's pooling_type
    say, else last token, L2-normalized) or score (/v1/rerank and /v1/score: a decoder
    reranker answering "yes" or "no" after a template, Qwen3-Reranker's unless its config.json
    says otherwise). auto: embed when the model says it is an embedder (sentence-transformers'
    modules.json, a bare-backbone architecture such as Qwen3Model, a GGUF pooling_type), else
    generate; score is never guessed."""
    matryoshka: bool | None = None
    """Whether embedding requests may ask for fewer `dimensions` (Matryoshka truncation, then
    renormalization). Default: as the model's config.json declares (is_matryoshka or
    matryoshka_dimensions, as vLLM reads them)."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.cpu_linear not in CPU_LINEARS:
            raise ValueError(f"cpu_linear must be one of {CPU_LINEARS}, got {self.cpu_linear!r}")
        if self.cpu_linear == "torch" and self.deterministic:
            raise ValueError(
                "cpu_linear 'torch' is not batch-invariant: it needs deterministic off "
                "(--no-deterministic)"
            )
        if self.cpu_isa not in CPU_ISAS:
            raise ValueError(f"cpu_isa must be one of {CPU_ISAS}, got {self.cpu_isa!r}")
        if self.quantized_activations not in QUANTIZED_ACTIVATIONS:
            raise ValueError(
                f"quantized_activations must be one of {QUANTIZED_ACTIVATIONS}, "
                f"got {self.quantized_activations!r}"
            )
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.attention_backend not in ("auto", "native", "torch"):
            raise ValueError(
                f"attention_backend must be auto, native or torch, got {self.attention_backend!r}"
            )


KV_CACHE_DTYPE_NAMES = ("auto", "bf16", "fp16", "fp32", "int8", "fp8", "fp8_e4m3")
"""CacheConfig.kv_cache_dtype's choices (vLLM's names; core/attention/base.py maps them)."""


@dataclass(frozen=True)
class CacheConfig:
    page_size: int = 16
    """Tokens per KV cache page."""
    kv_cache_memory: float = 2.0
    """KV cache budget in GiB on the CPU."""
    gpu_memory_utilization: float = 0.9
    """Fraction of the GPU's free memory (after loading weights) given to the KV cache."""
    num_pages: int | None = None
    """Exact number of KV pages, overriding the memory budget (tests, benchmarks)."""
    enable_prefix_caching: bool = True
    """Reuse the KV pages of prompt prefixes seen before."""
    kv_cache_dtype: str = "auto"
    """How the KV cache stores keys and values: auto (the model's dtype; fp16 where --dtype auto
    picks float32 for int16 or float activations: device_policy.resolve_kv_cache_dtype), bf16
    or fp32 (each only where it is the model's dtype), fp16 (the model's dtype, or on the CPU
    under a float32 or bf16 model: rounded as written, widened exactly as read), or int8 or
    fp8_e4m3 (= fp8; CPU: a scale per token and KV head; half the bytes of bf16, so twice the
    pages at a fixed kv_cache_memory)."""

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPE_NAMES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPE_NAMES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two >= 1, got {self.page_size}")
        if self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be > 0 GiB, got {self.kv_cache_memory}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    """Most requests running at once (each output of n>1 counts)."""
    max_num_batched_tokens: int = 512
    """Token budget of one engine step (decodes first, then prefill chunks)."""
    max_prefill_tokens_while_decoding: int = 256
    """Prompt tokens (over all prompt chunks and recomputes) one engine step may carry while
    other requests decode: bounds that step's time, and so the decoders' inter-token latency,
    when long prompts arrive. A step with no decode still prefills max_num_batched_tokens. Set
    it to max_num_batched_tokens for no separate bound (measured in bench/RESULTS.md)."""
    max_waiting: int = 1024
    """Most requests waiting for a seat; beyond it the server answers 429."""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.max_prefill_tokens_while_decoding < 1:
            raise ValueError(
                "max_prefill_tokens_while_decoding must be >= 1, got "
                f"{self.max_prefill_tokens_while_decoding}"
            )
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    """Processes (ranks) the model is split over, Megatron-style: attention heads, MLP width and
    vocabulary divided among them; one worker process per rank beyond the engine's own, joined
    by torch.distributed (gloo on CPU, NCCL on CUDA, one GPU per rank). Env: WORLD_SIZE;
    default 1."""
    nnodes: int = 1
    """Machines the ranks are spread over (equal shares; node 0 runs the server and rank 0).
    Env: NNODES; default 1."""
    node_rank: int = 0
    """This machine's index among nnodes; a node other than 0 runs workers only (no server).
    Env: NODE_RANK (else RANK); default 0."""
    master_addr: str = "127.0.0.1"
    """Address of node 0, where the ranks meet (torch.distributed's TCP store). Env:
    MASTER_ADDR; default 127.0.0.1."""
    master_port: int = 0
    """Port of the ranks' meeting point on node 0; 0 picks a free one (one node only). Env:
    MASTER_PORT; default 0."""
    distributed_timeout: float = 120.0
    """Seconds a collective inside a step, or the ranks' start-up, may wait for a peer before
    the engine gives up and reports itself dead."""

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.nnodes < 1 or self.tensor_parallel_size % self.nnodes:
            raise ValueError(
                f"nnodes ({self.nnodes}) must be >= 1 and divide tensor_parallel_size "
                f"({self.tensor_parallel_size})"
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(
                f"node_rank must be in [0, nnodes={self.nnodes}), got {self.node_rank}"
            )
        if not 0 <= self.master_port < 65536:
            raise ValueError(f"master_port must be in [0, 65535], got {self.master_port}")
        if self.nnodes > 1 and not self.master_port:
            raise ValueError("master_port: give a fixed port when nnodes > 1 (0 picks one locally)")
        if self.distributed_timeout <= 0:
            raise ValueError(f"distributed_timeout must be > 0 s, got {self.distributed_timeout}")

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes

    def node_ranks(self) -> range:
        """The global ranks this node hosts."""
        first = self.node_rank * self.ranks_per_node
        return range(first, first + self.ranks_per_node)


@dataclass(frozen=True)
class SpeculativeConfig:
    speculative_method: str | None = None
    """Speculative decoding: ngram (prompt lookup: the tokens that followed the last n tokens
    where they occurred before in the request's own prompt and output) or draft (a small model
    of the same tokenizer, --speculative-model); the target verifies the proposed tokens in one
    forward and keeps exactly the tokens it would have produced. Default: off."""
    num_speculative_tokens: int = 4
    """Most tokens proposed per sequence and step (the scheduler gives fewer, or none, to a
    sequence whose proposals are seldom accepted and to large batches)."""
    ngram_max: int = 4
    """ngram: the longest suffix matched (tried first)."""
    ngram_min: int = 2
    """ngram: the shortest suffix matched."""
    speculative_model: str | None = None
    """draft: the draft model (a local .gguf file or HF folder with the target's tokenizer)."""
    speculative_max_batch: int = 16
    """Most running sequences at which the engine still drafts. Up to it each draft token is
    proposed only while its expected acceptance pays for its row in a batch that size (the
    rule in docs/design.md, measured in bench/RESULTS.md)."""

    def __post_init__(self) -> None:
        method = self.speculative_method
        if method is not None and method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_method must be one of {SPECULATIVE_METHODS}, got {method!r}"
            )
        if self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"ngram_min ({self.ngram_min}) must be >= 1 and <= ngram_max ({self.ngram_max})"
            )
        if method == "draft" and not self.speculative_model:
            raise ValueError("speculative_model: the draft method needs a model path")
        if self.speculative_max_batch < 1:
            raise ValueError(
                f"speculative_max_batch must be >= 1, got {self.speculative_max_batch}"
            )

    def describe(self) -> str:
        """The start-up line's words for it ("off" when off)."""
        if self.speculative_method is None:
            return "off"
        k = self.num_speculative_tokens
        if self.speculative_method == "ngram":
            return f"ngram (n {self.ngram_max}..{self.ngram_min}, k {k})"
        return f"draft {self.speculative_model} (k {k})"


KV_EVENTS_PUBLISHERS = ("null", "zmq")


@dataclass(frozen=True)
class KVEventsConfig:
    """--kv-events-config: vLLM's JSON object, so llm-d and Dynamo routers read our KV events."""

    enable_kv_cache_events: bool = False
    """Publish the prefix cache's changes (pages stored and removed) for prefix-aware routers."""
    publisher: str = "null"
    """zmq: a ZeroMQ PUB socket of msgpack event batches; null: none."""
    endpoint: str = "tcp://*:5557"
    """Where the PUB socket binds (an address with * or ipc://) or connects (any other)."""
    replay_endpoint: str | None = None
    """Where a ROUTER socket binds that resends the batches from a given sequence number."""
    buffer_steps: int = 10_000
    """Batches (one per engine step with changes) kept for replay."""
    hwm: int = 100_000
    """The PUB socket's high-water mark (messages queued per subscriber)."""
    max_queue_size: int = 100_000
    """Batches waiting for the publisher thread before the engine drops new ones."""
    topic: str = ""
    """The first frame of every published message; `{model}` in it becomes the model's name as
    responses carry it (the first --served-model-name, a --models-dir name, else the file or
    folder's name; llm-d's `kv@POD_IP@{model}`)."""

    def __post_init__(self) -> None:
        if self.publisher not in KV_EVENTS_PUBLISHERS:
            raise ValueError(
                f"kv_events_config.publisher must be one of {', '.join(KV_EVENTS_PUBLISHERS)}, "
                f"got {self.publisher!r}"
            )
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"kv_events_config.{name} must be an integer >= 1")

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher != "null"

    def with_model(self, name: str) -> KVEventsConfig:
        """`{model}` in the topic replaced by `name` (a topic without it stays as it is)."""
        return replace(self, topic=self.topic.replace("{model}", name))

    def for_model(self, index: int, name: str) -> KVEventsConfig:
        """The config of a several-model server's index-th model (its place in /v1/models):
        `{model}` in the topic becomes its name, and each address it binds (the PUB endpoint
        when it binds, the replay endpoint) moves by the index as vLLM moves a data-parallel
        rank's: a tcp port + index (a `*` port stays: the system picks one), an ipc or inproc
        name + `_index`."""
        replay = self.replay_endpoint
        return replace(
            self.with_model(name),
            endpoint=_offset(self.endpoint, index) if binds(self.endpoint) else self.endpoint,
            replay_endpoint=_offset(replay, index) if replay is not None else None,
        )

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        """The flag's JSON object; ValueError naming what is wrong."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"kv_events_config is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError("kv_events_config must be a JSON object")
        names = {f.name: f for f in fields(cls)}
        for key, value in raw.items():
            if key not in names:
                raise ValueError(f"kv_events_config has no field {key!r} ({', '.join(names)})")
            kind = {"bool": bool, "int": int}.get(str(names[key].type), str)
            ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
            if not (ok or (value is None and key == "replay_endpoint")):
                what = {bool: "true or false", int: "an integer"}.get(kind, "a string")
                raise ValueError(f"kv_events_config.{key} must be {what}")
        return cls(**raw)


def binds(endpoint: str) -> bool:
    """vLLM's rule for the PUB endpoint: bind a wildcard, ipc:// or inproc:// address, connect
    to any other (a router's SUB that binds)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _offset(endpoint: str, index: int) -> str:
    if index == 0:
        return endpoint
    if endpoint.startswith(("ipc://", "inproc://")):
        return f"{endpoint}_{index}"
    base, _, port = endpoint.rpartition(":")
    if port == "*":
        return endpoint
    if not base.startswith("tcp://") or not port.isdigit():
        raise ValueError(f"kv_events_config: cannot give each model its own port in {endpoint!r}")
    if int(port) + index > 65535:
        raise ValueError(f"kv_events_config: model {index}'s port {int(port) + index} > 65535")
    return f"{base}:{int(port) + index}"


@dataclass(frozen=True)
class LoRAConfig:
    enable_lora: bool = False
    """Serve LoRA adapters of the model (implied by --lora-modules): each decoder projection
    gets zeroed adapter weights for --max-loras adapters of rank up to --max-lora-rank."""
    max_loras: int = 4
    """Adapters loaded at once (each holds a slot of adapter weights; every loaded adapter can
    run in the same step)."""
    max_lora_rank: int = 16
    """The largest adapter rank accepted; the adapter weights' memory grows with it."""
    lora_modules: tuple[tuple[str, str], ...] = ()
    """Adapters loaded at start-up: (name, path) pairs, each path a PEFT folder or a GGUF LoRA
    file (llama.cpp's convert_lora_to_gguf.py)."""

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if len(self.lora_modules) > self.max_loras:
            raise ValueError(f"lora_modules names {len(self.lora_modules)} adapters, more than "
                             f"max_loras ({self.max_loras})")  # fmt: skip
        names = [name for name, _ in self.lora_modules]
        if len(set(names)) != len(names):
            raise ValueError(f"lora_modules: an adapter name is given twice: {names}")

    @property
    def enabled(self) -> bool:
        return self.enable_lora or bool(self.lora_modules)


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)
