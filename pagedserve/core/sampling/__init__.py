"""The pieces of the batched sampler; `pagedserve.core.sampler` is the public entry point."""
