"""LoRA adapters: PEFT folders (peft.py) and llama.cpp's GGUF LoRA files (gguf.py) read, their
weights beside the base linear layers and the step's grouped product (weights.py), the loaded
adapters and their slots (registry.py)."""
