"""llama.cpp's own converter (convert_hf_to_gguf.py, from the llama-cpp-python sdist that
bench/serving/build_llama_cpp.sh unpacks into bench/.work/) on tiny Gemma 2, Gemma 3 and Phi-3 folders:
its files carry the same keys, values and tensor names as tests/tiny_gguf_families.py writes,
and our loader reads them into the logits transformers computes on the folder. Skipped where
that source is not unpacked (a clean checkout): run bench/serving/build_llama_cpp.sh once, then
`pytest -m slow tests/core/models/test_gguf_converter_parity.py`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
import torch

from bench.common.family_oracle import LONGROPE, PROMPT
from bench.common.tiny_models import make_hf_model
from bench.common.tiny_tokenizers import write_tiny_spm
from tests.core.models.paged_driver import PagedBatch
from tests.core.models.test_families import load
from tests.tiny_gguf_families import GGUF_FAMILY_SHAPE, write_gguf_family

WORK = Path(__file__).resolve().parents[3] / "bench" / ".work"
CONVERTERS = sorted(WORK.glob("llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
# slow: about 25 s a case (the converter imports transformers each time).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CONVERTERS,
        reason="llama.cpp's converter is not unpacked: run bench/serving/build_llama_cpp.sh",
    ),
]
CASES = {
    "gemma2": ("gemma2", {}),
    "gemma3": ("gemma3_text", {}),
    "phi3-window": ("phi3", {"sliding_window": 8}),
    "phi3-longrope": ("phi3", {"rope_scaling": LONGROPE, "original_max_position_embeddings": 8}),
}


def convert(folder: Path, out: Path) -> None:
    llama_cpp = CONVERTERS[-1].parent
    env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py")}  # its own gguf-py
    cmd = [sys.executable, str(CONVERTERS[-1]), str(folder), "--outfile", str(out)]
    done = subprocess.run([*cmd, "--outtype", "f32"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def model_keys(path: Path) -> dict[str, object]:
    fields = gguf.GGUFReader(path).fields
    skip = ("tokenizer.", "general.", "GGUF.")  # vocabularies differ by design (turn tokens)
    return {k: f.contents() for k, f in fields.items() if not k.startswith(skip)}


@pytest.mark.parametrize(("family", "config"), [pytest.param(*v, id=k) for k, v in CASES.items()])
def test_llama_cpp_converter_writes_what_our_fixture_writes(
    tmp_path: Path, family: str, config: dict
) -> None:
    folder = tmp_path / "hf"
    write_tiny_spm(folder)  # the converter reads tokenizer.model
    source = make_hf_model(family, seed=5, vocab_size=500, **GGUF_FAMILY_SHAPE[family], **config)
    source.save_pretrained(folder)
    theirs, ours = tmp_path / "llama-cpp.gguf", tmp_path / "ours.gguf"
    convert(folder, theirs)
    write_gguf_family(ours, family, seed=5, **config)
    assert model_keys(theirs) == model_keys(ours)
    names = [{t.name for t in gguf.GGUFReader(p).tensors} for p in (theirs, ours)]
    assert names[0] == names[1]
    model, arch = load(theirs)
    with torch.no_grad():
        expected = source(torch.tensor([PROMPT])).logits[0].float()
    batch = PagedBatch(model, arch)
    got = torch.cat([batch.step([PROMPT[:8]])] + [batch.step([[t]]) for t in PROMPT[8:]])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
