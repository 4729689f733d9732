"""HF folder loader: config.json plus one or many (sharded) *.safetensors files, memory-mapped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.families import arch_from_hf_config

INDEX_FILE = "model.safetensors.index.json"


def read_arch(folder: Path) -> ArchConfig:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json")
    with open(config_path, encoding="utf-8") as f:
        return arch_from_hf_config(json.load(f))


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files: those named by the shard index when there is one, else every
    *.safetensors in the folder."""
    index = folder / INDEX_FILE
    if index.is_file():
        with open(index, encoding="utf-8") as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors weights")
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"weight shards missing: {', '.join(missing)}")
    return files


def _open(path: Path) -> Any:
    """The shard, memory-mapped. safetensors loads here, with the first HF folder: a GGUF
    model's server never needs it (issue 42 item 4)."""
    from safetensors import safe_open

    return safe_open(str(path), framework="pt")


def count_safetensors_weights(files: list[Path]) -> int:
    total = 0
    for path in files:
        with _open(path) as f:
            total += len(f.keys())
    return total


def iter_safetensors_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor in its stored dtype) for every tensor of every shard."""
    for path in files:
        with _open(path) as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
