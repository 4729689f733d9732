"""llama.cpp itself on a tiny random Gemma 3, where bench/serving/build_llama_cpp.sh has unpacked
its sources (and built llama-server) into bench/.work/: its converter (convert_hf_to_gguf.py,
and with --mmproj) writes, in f32 and f16, the bytes bench/common/tiny_mmproj.py writes
(test_mmproj_gemma3.py's fixture), and we read its files into transformers' greedy tokens;
`llama-server --mmproj` on the same files counts the same prompt tokens for one and two images
and gives the same greedy tokens up to a near-tie. Slow: `pytest -m slow
tests/core/multimodal/test_mmproj_gemma3_llama_cpp.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common.tiny_gemma3_vl import IMAGE_SIZE
from bench.common.tiny_vlm import random_image
from pagedserve.core.multimodal.gemma3 import BOI
from tests.core.multimodal.test_mmproj_gemma3 import (
    IMAGES,
    NUM_TOKENS,
    QUESTION,
    files,  # noqa: F401 (fixtures)
    oracle,
    written,  # noqa: F401
)
from tests.core.multimodal.test_mmproj_llama_cpp import (
    CONVERTERS,
    LLAMA_SERVER,
    agree,
    assert_same_files,
    convert_pairs,
    llama_server,
)
from tests.core.multimodal.vlm_driver import assert_pairs_give, chat_prompt, load, messages

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CONVERTERS,
        reason="llama.cpp's converter is not unpacked: run bench/serving/build_llama_cpp.sh",
    ),
]
# Images of the tower's size: llama.cpp pads another size into the square where transformers
# (and we) stretch it.
SQUARE = [random_image(IMAGE_SIZE, IMAGE_SIZE, 2), random_image(IMAGE_SIZE, IMAGE_SIZE, 4)]


@pytest.fixture(scope="module")
def converted(written, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:  # noqa: F811
    return convert_pairs(written[0], tmp_path_factory.mktemp("converted-gemma3"))


def test_the_converter_writes_our_fixtures_bytes(converted, files) -> None:  # noqa: F811
    assert_same_files(converted, files)


def test_its_files_give_transformers_greedy_tokens(written, converted) -> None:  # noqa: F811
    assert_pairs_give(converted, oracle(written), IMAGES, QUESTION, NUM_TOKENS)


@pytest.mark.skipif(not LLAMA_SERVER.is_file(), reason="llama-server is not built in bench/.work")
def test_llama_server_agrees_on_the_same_files(converted, tmp_path: Path) -> None:
    """Our template's text with each <start_of_image> as transformers' processor surrounds it
    (blank lines) around llama.cpp's media marker (mtmd writes <start_of_image> and
    <end_of_image> around the image itself)."""
    lm, mmproj = converted["F32"]
    llm = load(lm, mmproj)
    template = llm.engine.chat_template
    assert template is not None
    with llama_server(lm, mmproj, tmp_path) as base_url:
        for num_images in (1, 2):
            images = SQUARE[:num_images]
            text = template.render(messages(images, QUESTION), add_generation_prompt=True)
            marked = text.replace(BOI, "\n\n<__media__>\n\n")
            agree(llm, base_url, chat_prompt(llm, images, QUESTION), marked, images)
