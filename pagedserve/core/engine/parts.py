"""EngineParts: what start-up built for one engine (engine/build.py makes it), and the
ModelInfo the server reads from it."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.core.engine_client import ModelInfo
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.multimodal.processor import ImageProcessor
from pagedserve.core.pooling_params import PoolerConfig
from pagedserve.core.runner.model_runner import ModelRunner
from pagedserve.core.sched.kv_cache import KVCacheLayout
from pagedserve.core.sched.scheduler import Scheduler
from pagedserve.core.tokenizers.chat_template import ChatTemplate
from pagedserve.core.tokenizers.load import Tokenizer


@dataclass
class EngineParts:
    resolved: ResolvedModel
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    arch: ArchConfig
    model_runner: ModelRunner
    scheduler: Scheduler
    max_model_len: int
    kv_layout: KVCacheLayout
    batch_invariant: bool
    """Greedy and seeded results are a function of the request alone (see is_batch_invariant)."""
    weights: str = ""
    """What runs the weights (ModelInfo.weights)."""
    pooler: PoolerConfig | None = None
    """How embedding requests pool (task embed); None: the model generates."""
    can_generate: bool = True
    """The model has an LM head (an embedding checkpoint may have none)."""
    image_processor: ImageProcessor | None = None
    """How the model takes images (None: a text-only model)."""

    @property
    def model_info(self) -> ModelInfo:
        return ModelInfo(
            name=self.resolved.name,
            max_model_len=self.max_model_len,
            vocab_size=self.tokenizer.vocab_size,
            page_size=self.kv_layout.spec.page_size,
            num_pages=self.kv_layout.num_pages,
            dtype=str(self.model_runner.dtype).removeprefix("torch."),
            device=str(self.model_runner.device),
            batch_invariant=self.batch_invariant,
            weights=self.weights,
            task=self.pooler.task if self.pooler is not None else "generate",
            pooler=self.pooler,
            kv_cache_dtype=self.kv_layout.spec.dtype_name,
        )
