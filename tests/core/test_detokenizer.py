"""The incremental detokenizer against a full decode, on three kinds of tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.common.tiny_tokenizers import (
    TRICKY_TEXTS,
    default_gguf_path,
    write_tiny_bpe,
    write_tiny_spm,
)
from pagedserve.core.tokenizers.detokenizer import IncrementalDetokenizer
from pagedserve.core.tokenizers.load import Tokenizer, load_tokenizer


@pytest.fixture(scope="module", params=["gguf", "bpe", "spm"])
def tokenizer(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Tokenizer:
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "gguf":
        return load_tokenizer(default_gguf_path())
    writer = write_tiny_bpe if request.param == "bpe" else write_tiny_spm
    return load_tokenizer(writer(tmp / request.param))


def _stream(detok: IncrementalDetokenizer, ids: list[int], rng: random.Random) -> list[str]:
    """Feed `ids` in random-sized chunks; returns every emitted piece, flush included."""
    pieces, pos = [], 0
    while pos < len(ids) and detok.stop_hit is None:
        size = rng.choice([1, 1, 1, 2, 3])
        pieces.append(detok.add(ids[pos : pos + size]))
        pos += size
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_streams_concatenate_to_full_decode(
    tokenizer: Tokenizer, skip_special_tokens: bool
) -> None:
    rng = random.Random(1)
    for _ in range(150):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 25))]
        detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        text = "".join(_stream(detok, ids, rng))
        assert text == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens), ids
        assert detok.text == text


def test_real_text_after_a_prompt(tokenizer: Tokenizer) -> None:
    """The first output tokens decode in the prompt's context (sentencepiece's leading space)."""
    rng = random.Random(2)
    for text in TRICKY_TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) < 2:
            continue
        cut = rng.randrange(1, len(ids))
        while tokenizer.decode(ids[:cut]).endswith("\ufffd"):
            cut -= 1  # the oracle needs a prompt that decodes whole
        prompt, output = ids[:cut], ids[cut:]
        detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=prompt)
        pieces = _stream(detok, output, rng)
        full, before = tokenizer.decode(ids), tokenizer.decode(prompt)
        assert full.startswith(before)
        assert "".join(pieces) == full[len(before) :], (text, cut)


def test_prompt_ending_inside_a_character(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("ok \U0001f44d\U0001f3fd", add_special_tokens=False)
    cut = next(c for c in range(len(ids), 0, -1) if tokenizer.decode(ids[:c]).endswith("\ufffd"))
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=ids[:cut])
    shown = "".join(detok.add([i]) for i in ids[cut:]) + detok.flush()
    assert shown.endswith("\U0001f3fd") and "\ufffd" not in shown


def test_split_characters_are_never_emitted_broken(tokenizer: Tokenizer) -> None:
    text = "\u4f60\u597d \U0001f600\U0001f44d\U0001f3fd caf\u00e9 \u00c5"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add([i]) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == tokenizer.decode(ids)


def test_at_least_one_character_spans_tokens(tokenizer: Tokenizer) -> None:
    """Guards the test above: some emoji must take several tokens, or it proves nothing."""
    assert len(tokenizer.encode("\U0001f44d\U0001f3fd", add_special_tokens=False)) > 2


def _expected_before_stop(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """Slow oracle: the stop string whose end comes first in the full text."""
    found = [(text.find(s) + len(s), -len(s), s) for s in stops if s in text]
    if not found:
        return text, None
    end, _, stop = min(found)
    return (text[:end] if include else text[: end - len(stop)]), stop


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_split_across_tokens(tokenizer: Tokenizer, include: bool) -> None:
    rng = random.Random(3)
    text = "The quick brown fox jumps over the lazy dog. Hello world!\n\ndef add(a, b): return a"
    ids = tokenizer.encode(text, add_special_tokens=False)
    full = tokenizer.decode(ids)
    for _ in range(60):
        start = rng.randrange(len(full) - 6)
        stops = [
            full[start : start + rng.randint(1, 6)],
            "zzz",
            full[rng.randrange(len(full)) :][:3],
        ]
        stops = [s for s in stops if s]
        detok = IncrementalDetokenizer(tokenizer, stop=stops, include_stop_str_in_output=include)
        emitted = "".join(_stream(detok, ids, rng))
        expected, stop = _expected_before_stop(full, stops, include)
        assert (emitted, detok.stop_hit) == (expected, stop), stops
        if stop is not None:
            assert detok.add(ids[:1]) == ""  # nothing after a stop string, ever


def test_text_that_may_become_a_stop_string_waits(tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer, stop=["world peace"])
    shown = detok.add(tokenizer.encode("Hello world", add_special_tokens=False))
    assert shown == "Hello "  # "world" could still grow into "world peace"
    assert detok.flush() == "world"
    assert detok.stop_hit is None and detok.text == "Hello world"


def test_empty_stop_string_is_rejected(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="stop"):
        IncrementalDetokenizer(tokenizer, stop=[""])


def test_special_token_as_stop_string(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(write_tiny_bpe(tmp_path))
    detok = IncrementalDetokenizer(tokenizer, stop=["<|im_end|>"], skip_special_tokens=False)
    ids = tokenizer.encode("answer<|im_end|>more", add_special_tokens=False)
    assert "".join(detok.add([i]) for i in ids) == "answer"
    assert detok.stop_hit == "<|im_end|>"
