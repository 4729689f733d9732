"""Model families, weight loaders and model resolution.

resolve_model turns the user's string into a local file or folder; load_model builds the torch
module for it.
"""

from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.llama import LlamaForCausalLM
from pagedserve.core.models.registry import MODEL_CLASSES, load_model
from pagedserve.core.models.resolve import ResolvedModel, resolve_model

__all__ = [
    "MODEL_CLASSES",
    "ArchConfig",
    "LlamaForCausalLM",
    "ResolvedModel",
    "load_model",
    "resolve_model",
]
