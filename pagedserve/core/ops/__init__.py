"""The native ops the models build on: wrappers of pagedserve._core and pagedserve._cuda.

    native.py         the one importer of the compiled modules (torch-free: the scheduler uses it)
    base.py           NativeOp (declare a custom op once), the dtype map, the row checks
    layer_ops.py      rms_norm, rotary, silu_and_mul (native on CPU, torch elsewhere)
    linear.py         packed_linear, packed_gated_linear, weight packing (bf16 / fp32, ISA avx2+)
    linear_quant.py   quant_linear: GGUF weights kept quantized (int8 activations)
    cpu_features.py   the CPU's features and the native kernels' ISA level

Nothing here imports pagedserve.core.models or attention: they import these ops. The paged
attention ops live with the attention backends (core/attention/ops.py), the decoder stack's with
the stack (core/models/decoder_stack/ops.py). This file imports nothing, so that `ops.native`
stays importable without torch.
"""
