"""LoRA adapters: PEFT folders read (peft.py), their weights beside the base linear layers and the
step's grouped product (weights.py), the loaded adapters and their slots (registry.py)."""
