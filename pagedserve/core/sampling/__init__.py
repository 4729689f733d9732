"""The pieces of the batched sampler; `pagedserve.core.sampling.sampler` is the public entry point."""
