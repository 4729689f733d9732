"""LoRA adapters at run time: vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter,
and the adapters' cards in /v1/models."""
