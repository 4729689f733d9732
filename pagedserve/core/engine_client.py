"""EngineClient: what the server may ask of an engine, and ModelInfo: what it may know of it.

`openai_compat` and the CLI hold an engine only through this protocol: `AsyncEngine`
implements it, and so does the test suite's fake engine. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pagedserve.core.lora_request import LoRARequest
    from pagedserve.core.multimodal.inputs import MultiModalInputs
    from pagedserve.core.multimodal.processor import ImageProcessor
    from pagedserve.core.outputs import EngineStats, RequestOutput
    from pagedserve.core.pooling_params import PoolerConfig, PoolingParams
    from pagedserve.core.sampling_params import SamplingParams, StructuredOutputs
    from pagedserve.core.tokenizers.chat_template import ChatTemplate
    from pagedserve.core.tokenizers.load import Tokenizer


@dataclass(frozen=True)
class ModelInfo:
    """The loaded model and its limits, as the server reports them."""

    name: str
    """The model's name (the file or folder it was loaded from)."""
    max_model_len: int
    """Prompt plus completion tokens one request may hold."""
    vocab_size: int
    """Token ids are in [0, vocab_size)."""
    page_size: int
    """Tokens per KV cache page."""
    num_pages: int
    """KV cache pages in the pool."""
    dtype: str
    """The model's element type, e.g. "bfloat16" (the KV cache's too unless kv_cache_dtype)."""
    device: str
    """Where the model runs, e.g. "cpu" or "cuda:0"."""
    batch_invariant: bool
    """Greedy and seeded results are a function of the request alone, not of the batch."""
    weights: str = ""
    """What runs the weights, e.g. "Q4_1 x 210, Q8_0 x 1 kept quantized (native avx512-vnni)"
    or "bfloat16" (dequantized or unquantized)."""
    task: str = "generate"
    """What the model serves: "generate" or "embed" (ModelConfig.task, resolved)."""
    pooler: PoolerConfig | None = None
    """How an embedding model pools (None when the task is generate)."""
    speculative: str = "off"
    """Speculative decoding, as the start-up line names it (SpeculativeConfig.describe)."""
    kv_cache_dtype: str = ""
    """How the KV cache stores keys and values, e.g. "int8" (--kv-cache-dtype; "": dtype)."""


class RequestStream(Protocol):
    """The outputs of one admitted request, as deltas; the last one has `finished` set."""

    def __aiter__(self) -> RequestStream: ...

    async def __anext__(self) -> RequestOutput: ...

    def close(self) -> None:
        """Abort the request (if it is still running) and free its pages."""


class EngineClient(Protocol):
    """An engine as the server sees it. Admission is synchronous: `generate` raises
    ContextLengthError, QueueFullError or EngineDeadError before the caller sends anything."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The model's (or the configured) chat template; None when there is none."""

    @property
    def model_info(self) -> ModelInfo: ...

    @property
    def image_processor(self) -> ImageProcessor | None:
        """How the model takes images (None: a text-only model)."""

    @property
    def errored(self) -> bool:
        """True once the engine has stopped after a fault; every call is then refused."""

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        multimodal: MultiModalInputs | None = None,
        lora_request: LoRARequest | None = None,
    ) -> RequestStream:
        """Admit the request and return the stream of its outputs. `multimodal`: its images,
        whose tokens are placeholder ids in `prompt_token_ids` (core/multimodal/inputs.py);
        `lora_request`: the adapter it runs with (one of list_loras(); None: the base)."""

    def embed(
        self, request_id: str, prompt_token_ids: list[int], params: PoolingParams
    ) -> RequestStream:
        """Admit an embedding request (prefill only); its one output carries `embedding`.
        Raises ContextLengthError, QueueFullError, EngineDeadError, or ValueError when the
        model serves no embeddings."""

    def compile_grammar(self, spec: StructuredOutputs) -> None:
        """Compile the spec's grammar where `generate` will find it (any thread; raises
        GrammarError when it does not compile)."""

    def abort(self, request_id: str) -> None:
        """Stop a request and free its pages; unknown ids are ignored."""

    def stats(self) -> EngineStats:
        """A snapshot of the running batch and the KV cache (for /metrics)."""

    def list_loras(self) -> list[LoRARequest]:
        """The LoRA adapters loaded now (none when the engine serves none)."""

    async def load_lora(self, name: str, path: str) -> LoRARequest:
        """Load a LoRA adapter (a PEFT folder or a GGUF LoRA file); LoRAError naming what is wrong (and nothing changes)."""

    async def unload_lora(self, name: str) -> None:
        """Forget an adapter (running requests finish with it); LoRANotFoundError if none
        has that name."""

    async def shutdown(self) -> None:
        """Fail what is still running and stop the engine."""
