"""/v1/embeddings: its request model and serving."""
