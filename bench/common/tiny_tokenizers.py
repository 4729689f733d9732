"""Tiny tokenizers trained on the fly, written the way a model folder holds them.

Other tests use these to build tiny models without downloading anything:

    folder = tmp_path / "bpe"
    write_tiny_bpe(folder)            # tokenizer.json + tokenizer_config.json
    write_tiny_spm(tmp_path / "spm")  # tokenizer.model + tokenizer_config.json

Both vocabularies are small (hundreds of tokens) and train in well under a second.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path

import sentencepiece as spm
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA2_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
)

# Enough variety that merges form for words, digits, code and a little non-Latin text.
TRAINING_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! Hello there, how are you today?",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n\tprint(i * 2)",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber fa\u00e7ade",
    "\u4f60\u597d\u4e16\u754c \u3053\u3093\u306b\u3061\u306f \u043f\u0440\u0438\u0432\u0435\u0442",
    "A paged KV cache keeps every request's keys and values in fixed-size pages.",
    "The scheduler batches requests continuously; the model runner executes the plan.",
    "Once upon a time, there was a little model that could serve many users at once.",
] * 4

BPE_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_tiny_bpe(
    vocab_size: int = 400,
    special_tokens: Sequence[str] = BPE_SPECIAL_TOKENS,
    corpus: Sequence[str] = TRAINING_CORPUS,
) -> Tokenizer:
    """A GPT-2 style byte-level BPE; the special tokens take the first ids (by default ChatML's:
    <|endoftext|> = 0, <|im_start|> = 1, <|im_end|> = 2)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


def write_tiny_bpe(
    folder: Path, vocab_size: int = 400, chat_template: str = CHATML_TEMPLATE
) -> Path:
    """Write tokenizer.json + tokenizer_config.json (+ generation_config.json) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    train_tiny_bpe(vocab_size).save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": chat_template,
    }
    _write_json(folder / "tokenizer_config.json", config)
    # A second end-of-sequence id, as instruct models often list (<|endoftext|>).
    _write_json(folder / "generation_config.json", {"eos_token_id": [2, 0]})
    return folder


def train_tiny_spm(vocab_size: int = 500, model_type: str = "bpe") -> bytes:
    """A Llama-style SentencePiece model (serialized ModelProto): byte fallback, split digits,
    no normalization, whitespace kept as is, <unk>=0 <s>=1 </s>=2."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING_CORPUS),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        allow_whitespace_only_pieces=True,
        character_coverage=1.0,
        hard_vocab_limit=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    return model.getvalue()


def write_tiny_spm(
    folder: Path,
    vocab_size: int = 500,
    model_type: str = "bpe",
    chat_template: str = LLAMA2_TEMPLATE,
) -> Path:
    """Write tokenizer.model + tokenizer_config.json into `folder` (a Llama-2 style folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(train_tiny_spm(vocab_size, model_type))
    config = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": False,
        "chat_template": chat_template,
    }
    _write_json(folder / "tokenizer_config.json", config)
    return folder


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2), encoding="utf-8")


# Text that tends to expose tokenizer differences: whitespace runs, leading spaces, newlines and
# tabs, accents, CJK, emoji, code, numbers, and special-token strings written in the text.
TRICKY_TEXTS = [
    "Hello world",
    " leading space",
    "  two leading spaces",
    "trailing spaces   ",
    "multiple   inner    spaces",
    "line one\nline two\n\nline four\r\nwindows",
    "\ttabbed\t\tcolumns\t",
    "\n\n\nstarts with newlines",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber fa\u00e7ade \u00c5ngstr\u00f6m",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "emoji \U0001f600\U0001f44d\U0001f3fd family \U0001f468\u200d\U0001f469\u200d\U0001f467",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n",
    "numbers 0 7 42 1234567890 3.14159 -2e10 1,000,000",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] hello [/INST] answer</s>",
    "text<s>glued</s>tokens<unk>",
    "it's don't we'll I'M",
    "\u2581already a metaspace",
    "",
    " ",
    "\u00a0non-breaking\u3000ideographic space",
]


def default_gguf_path() -> Path:
    """The default model's GGUF (SmolLM2-135M-Instruct Q4_1), fetched once and cached."""
    from pagedserve.core.models.resolve import resolve_model

    return resolve_model("").path


def write_tiny_spm_gguf(path: Path, vocab_size: int = 500) -> Path:
    """A GGUF holding only a `llama` (sentencepiece) vocabulary and one tiny tensor: enough for
    tokenizer loaders, ours and transformers'."""
    import gguf
    import numpy as np
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    proto.ParseFromString(train_tiny_spm(vocab_size))
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(8)
    writer.add_head_count(1)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([p.piece for p in proto.pieces])
    writer.add_token_scores([p.score for p in proto.pieces])
    writer.add_token_types([p.type for p in proto.pieces])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_tensor("token_embd.weight", np.zeros((len(proto.pieces), 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
