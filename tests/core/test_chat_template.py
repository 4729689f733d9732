"""Chat templates render like transformers' apply_chat_template, inside a sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.common.tiny_tokenizers import default_gguf_path, write_tiny_bpe, write_tiny_spm
from pagedserve.core.tokenizers.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    NoChatTemplateError,
    load_chat_template,
)
from pagedserve.core.tokenizers.load import load_tokenizer

transformers = pytest.importorskip("transformers")

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another, with \u00e9\u4f60\U0001f600 and\nnewlines\t."},
    ],
    [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Arr."},
        {"role": "user", "content": "  spaced  "},
    ],
]


@pytest.fixture(scope="module")
def default_pair(hf_default_tokenizer):
    return load_chat_template(load_tokenizer(default_gguf_path())), hf_default_tokenizer


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_default_model_matches_transformers(default_pair, messages, add_generation_prompt) -> None:
    ours, theirs = default_pair
    expected = theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.render(messages, add_generation_prompt=add_generation_prompt) == expected


@pytest.mark.parametrize("writer", [write_tiny_bpe, write_tiny_spm])
def test_tiny_folders_match_transformers(tmp_path: Path, writer) -> None:
    folder = writer(tmp_path / "tok")
    ours = load_chat_template(load_tokenizer(folder))
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    messages.append({"role": "user", "content": "c"})
    expected = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.render(messages) == expected


def _template(source: str) -> ChatTemplate:
    return ChatTemplate(source, bos_token="<s>", eos_token="</s>")


def test_helpers_like_transformers() -> None:
    rendered = _template("{{ bos_token }}{{ messages | tojson }}{{ eos_token }}").render(
        [{"role": "user", "content": "\u00e9 <b>"}]
    )
    assert rendered == '<s>[{"role": "user", "content": "\u00e9 <b>"}]</s>'
    assert len(_template("{{ strftime_now('%Y-%m-%d') }}").render([])) == 10
    loop = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}"
    assert _template(loop).render([{"role": "a"}, {"role": "b"}]) == "a"
    assert _template("{% if tools %}{{ tools | length }}{% endif %}").render([], tools=[{}]) == "1"
    assert _template("{{ date_string }}").render([], date_string="today") == "today"


def test_trim_and_lstrip_blocks() -> None:
    source = (
        "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}"
    )
    assert _template(source).render([{"content": "x"}, {"content": "y"}]) == "x\ny\n"


def test_raise_exception_is_a_chat_template_error() -> None:
    source = (
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="first must be user"):
        _template(source).render([{"role": "system", "content": "x"}])


@pytest.mark.parametrize(
    "attack",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__ }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ raise_exception.__globals__ }}",
        "{{ messages.append(1) }}",
        "{% set x = messages.clear() %}",
    ],
)
def test_python_internals_are_out_of_reach(attack: str) -> None:
    with pytest.raises(ChatTemplateError):
        _template(attack).render([{"role": "user", "content": "x"}])


def test_broken_templates_are_chat_template_errors() -> None:
    with pytest.raises(ChatTemplateError):
        _template("{% for %}")
    with pytest.raises(ChatTemplateError):
        _template("{{ messages[5].content }}").render([])


def test_override_file_wins(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(write_tiny_bpe(tmp_path / "tok"))
    (tmp_path / "t.jinja").write_text("{{ messages[0].content }}!")
    assert load_chat_template(tokenizer, tmp_path / "t.jinja").render([{"content": "x"}]) == "x!"
    (tmp_path / "t.json").write_text(json.dumps({"chat_template": "{{ eos_token }}"}))
    assert load_chat_template(tokenizer, tmp_path / "t.json").render([]) == "<|im_end|>"
    with pytest.raises(ValueError, match="chat_template"):
        load_chat_template(tokenizer, tmp_path / "missing.jinja")


def test_no_template_is_none_and_has_a_clear_error(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(write_tiny_bpe(tmp_path / "tok", chat_template=None))
    assert load_chat_template(tokenizer) is None
    assert "chat template" in str(NoChatTemplateError())


def test_named_templates_take_default(tmp_path: Path) -> None:
    folder = write_tiny_bpe(tmp_path / "tok")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "plain"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_chat_template(load_tokenizer(folder)).render([]) == "plain"
