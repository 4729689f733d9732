"""POST /v1/rerank (Cohere's and Jina's shape) and POST /v1/score (vLLM's), on a reranker
served with --task score; the scores are embeddings' machinery underneath (embeddings/)."""
