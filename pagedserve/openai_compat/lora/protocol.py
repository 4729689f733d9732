"""The bodies of vLLM's adapter endpoints (`lora_name`, `lora_path`), plus `model`: which
loaded base model takes the adapter when the server offers several."""

from __future__ import annotations

from pydantic import BaseModel, Field

from pagedserve.openai_compat.common.protocol import Text, _Strict


class LoadLoRAAdapterRequest(_Strict):
    lora_name: Text = Field(min_length=1)
    lora_path: Text = Field(min_length=1)
    """On the server's disk: a PEFT folder (adapter_config.json + adapter_model.safetensors)
    or a GGUF LoRA file (llama.cpp's convert_lora_to_gguf.py)."""
    model: str | None = None
    """The base model (only needed when the server offers several)."""


class UnloadLoRAAdapterRequest(_Strict):
    lora_name: Text = Field(min_length=1)
    lora_int_id: int | None = None
    """Accepted (vLLM's clients send it) and unused: the name is the adapter's."""
    model: str | None = None


LORA_REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/v1/load_lora_adapter": LoadLoRAAdapterRequest,
    "/v1/unload_lora_adapter": UnloadLoRAAdapterRequest,
}
"""The adapter routes' bodies (openapi.py)."""
