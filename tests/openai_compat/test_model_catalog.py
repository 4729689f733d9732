"""Which models a server offers (openai_compat/model_catalog.py): --models-dir's scan, the
config file's names, paths and per-model flags, the KV shares, and the errors naming what is
wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedserve.core.config import EngineConfig
from pagedserve.openai_compat.model_catalog import ModelsConfig, read_catalog, scan_dir


def test_a_models_dir_offers_every_hf_folder_and_gguf_file(tmp_path: Path) -> None:
    (tmp_path / "qwen.gguf").write_bytes(b"x" * 10)
    (tmp_path / "mmproj-qwen.gguf").write_bytes(b"x")  # a vision projector, not a model
    (tmp_path / "notes.txt").write_text("not a model")
    hf = tmp_path / "llama-tiny"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"x" * 30)
    (hf / "nested.gguf").write_bytes(b"x")  # inside a model's folder: part of it
    group = tmp_path / "more"
    group.mkdir()
    (group / "phi.gguf").write_bytes(b"x" * 5)
    assert [(n, p.relative_to(tmp_path)) for n, p in scan_dir(str(tmp_path))] == [
        ("llama-tiny", Path("llama-tiny")), ("phi", Path("more/phi.gguf")),
        ("qwen", Path("qwen.gguf"))]  # fmt: skip
    models = read_catalog(ModelsConfig(models_dir=str(tmp_path)), EngineConfig())
    kv = {m.name: m.engine.cache.kv_cache_memory for m in models}
    assert kv == {"llama-tiny": 2.0 / 3, "phi": 2.0 / 3, "qwen": 2.0 / 3}  # the total, shared
    by_name = {m.name: m for m in models}
    # its weight files (the safetensors and the .gguf inside it) + its KV share
    assert by_name["llama-tiny"].memory_bytes == 31 + int(2.0 / 3 * (1 << 30))
    (group / "qwen.gguf").write_bytes(b"x")
    with pytest.raises(ValueError, match="two models named 'qwen'"):
        scan_dir(str(tmp_path))
    with pytest.raises(ValueError, match="is not a folder"):
        scan_dir(str(tmp_path / "missing"))


def test_a_models_config_file_sets_per_model_flags(tmp_path: Path) -> None:
    """Names, paths relative to the file, flags with - or _, preload, a KV share of its own."""
    (tmp_path / "m.gguf").write_bytes(b"x" * 100)
    config = tmp_path / "models.yaml"
    config.write_text("models:\n  small: {path: m.gguf, max-model-len: 128, task: embed}\n"
                      "  other: {path: m.gguf, preload: true, kv_cache_memory: 0.5}\n")  # fmt: skip
    models = read_catalog(ModelsConfig(models_config=str(config), max_loaded_models=2),
                          EngineConfig())  # fmt: skip
    by_name = {m.name: m for m in models}
    small, other = by_name["small"], by_name["other"]
    assert small.engine.model.model == str(tmp_path / "m.gguf")
    assert small.engine.model.max_model_len == 128 and small.engine.model.task == "embed"
    assert small.engine.cache.kv_cache_memory == 1.0  # 2 GiB over 2 slots
    assert not small.preload and other.preload and other.engine.cache.kv_cache_memory == 0.5
    assert small.memory_bytes == 100 + (1 << 30)
    as_json = tmp_path / "models.json"
    as_json.write_text(json.dumps({"models": {"j": {"path": "m.gguf", "seed": 3}}}))
    [j] = read_catalog(ModelsConfig(models_config=str(as_json)), EngineConfig())
    assert j.name == "j" and j.engine.model.seed == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models:\n  s: {path: m.gguf, max_tokenz: 3}\n", "unknown setting 'max_tokenz'"),
        ("models:\n  s: {max_model_len: 3}\n", "needs a `path`"),
        ("models:\n  s: {path: m.gguf, page_size: 3}\n", "page_size must be a power of two"),
        ("models: [a, b]\n", "needs a `models:` mapping"),
        ("models: {s: [\n", "not valid YAML"),
    ],
)
def test_a_bad_config_file_is_an_error_naming_it(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "models.yaml"
    config.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_catalog(ModelsConfig(models_config=str(config)), EngineConfig())


def test_the_pool_flags_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_loaded_models"):
        ModelsConfig(max_loaded_models=-1)
    with pytest.raises(ValueError, match="idle_unload"):
        ModelsConfig(idle_unload=-1)
    with pytest.raises(ValueError, match="no model found"):
        read_catalog(ModelsConfig(models_dir=str(tmp_path)), EngineConfig())
