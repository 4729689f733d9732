"""Which models a server offers (issue 39): `--models-dir` and `--models-config` -> one
EngineConfig per model name, with its KV share of `--kv-cache-memory` and its memory estimate.

Under a models folder every HF folder (it has a config.json) and every .gguf file is a model,
named by its folder or file stem (mmproj files are not models). A config file (YAML or JSON)
names models and their own flags:

    models:
      smol: {path: smol.gguf, max_model_len: 2048}
      embedder: {path: bge-small, task: embed, preload: true}

Relative paths are the config file's. A model's keys are the serve flags of its engine (any
field of ModelConfig, CacheConfig, SchedulerConfig, SpeculativeConfig, with - or _) plus
`preload`; anything else is refused, naming the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from pagedserve.core.config import (
    CacheConfig,
    EngineConfig,
    KVEventsConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    binds,
)

GIB = 1 << 30
_SECTIONS = {"model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig,
             "speculative": SpeculativeConfig}  # fmt: skip
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


@dataclass(frozen=True)
class ModelsConfig:
    models_dir: str | None = None
    """Serve every model under DIR: each HF folder (with a config.json) and each .gguf file,
    named by its folder or file stem and loaded when a request first names it."""
    models_config: str | None = None
    """YAML or JSON file naming models and their own flags: `models: {NAME: {path: P,
    max_model_len: N, task: embed, preload: true, ...}}` (with --models-dir: added to its
    models, a name of both taking the file's flags)."""
    max_loaded_models: int = 0
    """Most models loaded at once; loading another first unloads the least recently used idle
    one (0: no limit). Each loaded model's KV cache is --kv-cache-memory divided by this (or by
    the number of models when 0)."""
    models_memory: float = 0.0
    """Most GiB the loaded models may hold together, estimated as their weight files plus their
    KV budgets; loading past it first unloads idle models, least recently used first (0: no
    limit)."""
    idle_unload: float = 0.0
    """Seconds after which a model that served nothing is unloaded, weights and KV cache
    (0: never); the next request for it loads it again."""

    def __post_init__(self) -> None:
        if self.max_loaded_models < 0:
            raise ValueError(f"max_loaded_models must be >= 0, got {self.max_loaded_models}")
        if self.models_memory < 0:
            raise ValueError(f"models_memory must be >= 0 GiB, got {self.models_memory}")
        if self.idle_unload < 0:
            raise ValueError(f"idle_unload must be >= 0 seconds, got {self.idle_unload}")

    @property
    def catalog(self) -> bool:
        """Models come from a folder or a file (else: the one model of the command line)."""
        return bool(self.models_dir or self.models_config)


@dataclass(frozen=True)
class CatalogModel:
    name: str
    engine: EngineConfig
    memory_bytes: int
    """Weight files plus KV budget: the memory budget's estimate of it once loaded."""
    preload: bool = False


def read_catalog(models: ModelsConfig, base: EngineConfig) -> list[CatalogModel]:
    """The models, each with `base`'s flags but its own path, overrides and KV share; raises
    ValueError naming what is wrong."""
    overrides: dict[str, dict[str, Any]] = {}
    if models.models_dir:
        overrides.update({name: {"path": str(path)} for name, path in scan_dir(models.models_dir)})
    if models.models_config:
        for name, values in _read_config(Path(models.models_config)).items():
            overrides[name] = {**overrides.get(name, {}), **values}
    if not overrides:
        where = models.models_dir or models.models_config
        raise ValueError(f"no model found in {where} (HF folders with config.json, .gguf files)")
    slots = models.max_loaded_models or len(overrides)
    kv_share = base.cache.kv_cache_memory / slots
    catalog = [_model(name, values, base, kv_share) for name, values in overrides.items()]
    return _kv_events_per_model(catalog)


def _kv_events_per_model(catalog: list[CatalogModel]) -> list[CatalogModel]:
    """Each model's KV events apart (KVEventsConfig.for_model: by its place in the catalog, as
    /v1/models lists it); ValueError when two would still share a socket."""
    if not any(m.engine.kv_events.enabled for m in catalog):
        return catalog
    catalog = [
        replace(m, engine=replace(m.engine, kv_events=m.engine.kv_events.for_model(i, m.name)))
        for i, m in enumerate(catalog)
    ]
    check_kv_events_addresses([(m.name, m.engine.kv_events) for m in catalog])
    return catalog


def check_kv_events_addresses(models: list[tuple[str, KVEventsConfig]]) -> None:
    """ValueError naming the two models when two engines would bind one address (a tcp port,
    an ipc or inproc name), or publish to one router's address under one topic."""
    owners: dict[str, str] = {}
    for name, config in models:
        if not config.enabled:
            continue
        bound = [config.endpoint] if binds(config.endpoint) else []
        bound += [config.replay_endpoint] if config.replay_endpoint is not None else []
        uses = [f"bind {_address_key(a)}" for a in bound if not a.endswith(":*")]
        if not binds(config.endpoint):
            uses.append(f"publish to {config.endpoint} under the topic {config.topic!r} (put "
                        "{model} in kv_events_config.topic)")  # fmt: skip
        for use in uses:
            if use in owners:
                raise ValueError(
                    f"kv_events_config: models {owners[use]!r} and {name!r} would both {use}"
                )
            owners[use] = name


def _address_key(address: str) -> str:
    """A bound address by what two binds share: a tcp port on any host (`*` takes them all)."""
    if address.startswith("tcp://"):
        return f"tcp port {address.rpartition(':')[2]}"
    return address


def scan_dir(folder: str) -> list[tuple[str, Path]]:
    """(name, path) of every model under `folder`, sorted by name."""
    root = Path(folder).expanduser().absolute()
    if not root.is_dir():
        raise ValueError(f"models_dir: {folder} is not a folder")
    found: dict[str, Path] = {}

    def add(name: str, path: Path) -> None:
        if name in found:
            raise ValueError(f"models_dir: two models named {name!r}: {found[name]} and {path}")
        found[name] = path

    def walk(path: Path) -> None:
        for child in sorted(path.iterdir()):
            if child.is_dir():
                if (child / "config.json").is_file():
                    add(child.name, child)
                else:
                    walk(child)
            elif child.suffix == ".gguf" and not child.name.startswith("mmproj"):
                add(child.stem, child)

    walk(root)
    return sorted(found.items())


def _read_config(path: Path) -> dict[str, dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"models_config: cannot read {path}: {exc.strerror}") from None
    data = _parse(path, text)
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict) or not models:
        raise ValueError(f"models_config: {path} needs a `models:` mapping of names to settings")
    out: dict[str, dict[str, Any]] = {}
    for name, values in models.items():
        if not isinstance(values, dict) or not isinstance(values.get("path"), str):
            raise ValueError(f"models_config: model {name!r} needs a `path`")
        values = {str(k).replace("-", "_"): v for k, v in values.items()}
        model_path = Path(values["path"]).expanduser()
        values["path"] = str(model_path if model_path.is_absolute() else path.parent / model_path)
        out[str(name)] = values
    return out


def _parse(path: Path, text: str) -> Any:
    if path.suffix in (".yaml", ".yml"):
        import yaml  # only for YAML files

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"models_config: {path} is not valid YAML: {exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"models_config: {path} is not valid JSON: {exc}") from None


def _model(name: str, values: dict[str, Any], base: EngineConfig, kv_share: float) -> CatalogModel:
    values = dict(values)
    path, preload = values.pop("path"), bool(values.pop("preload", False))
    values.setdefault("kv_cache_memory", kv_share)
    sections: dict[str, dict[str, Any]] = {section: {} for section in _SECTIONS}
    for key, value in values.items():
        section = next((s for s, cls in _SECTIONS.items() if key in _field_names(cls)), None)
        if section is None or key == "model":
            raise ValueError(f"models_config: model {name!r}: unknown setting {key!r}")
        sections[section][key] = value
    sections["model"]["model"] = path
    try:
        engine = replace(
            base, **{s: replace(getattr(base, s), **v) for s, v in sections.items() if v}
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"models_config: model {name!r}: {exc}") from None
    kv_bytes = int(engine.cache.kv_cache_memory * GIB)
    return CatalogModel(name, engine, weight_bytes(Path(path)) + kv_bytes, preload)


def _field_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def weight_bytes(path: Path) -> int:
    """The size of a model's weight files (a GGUF file, or a folder's weights): what its
    weights take once loaded, about (quantized GGUF blocks stay as they are)."""
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
    return 0
