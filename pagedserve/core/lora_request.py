"""Which LoRA adapter a request runs with (vLLM's `LoRARequest` shape), and the error a bad
adapter raises (stdlib only: the server names both)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name: `lora_name` as clients send it in `model`, `lora_int_id` the id the
    engine gave it when it loaded (> 0; a reload under the same name gets a new one, so the
    prefix cache never serves the old adapter's pages), `lora_path` where it was read from."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""


class LoRAError(ValueError):
    """An adapter that cannot be loaded or used; the message names the file, field or module."""


class LoRANotFoundError(LoRAError):
    """No adapter of that name is loaded."""
