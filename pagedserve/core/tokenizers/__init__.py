"""Tokenizer implementations behind `pagedserve.core.tokenizer` (the public entry point).

`base` holds the interface, `hf` the `tokenizers`-backed BPE, `spm` the sentencepiece one,
`gguf_vocab` builds either from a GGUF file's vocabulary, `folder` reads an HF model folder.
"""
