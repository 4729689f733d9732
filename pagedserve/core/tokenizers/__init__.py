"""Tokenizers, chat templates and detokenization.

`load` is the entry point (load_tokenizer: a GGUF file or an HF folder); `base` holds the
interface, `hf` the `tokenizers`-backed BPE, `spm` the sentencepiece one, `gguf_vocab` builds
either from a GGUF file's vocabulary, `folder` reads an HF model folder; `chat_template` renders
the model's template (jinja2, sandboxed), `detokenizer` turns ids back into text incrementally.
"""
