"""The one home of the native ops: every wrapper of pagedserve._core and pagedserve._cuda.

    native.py         the one importer of the compiled modules (torch-free: the scheduler uses it)
    base.py           NativeOp (declare a custom op once), the dtype map, the row checks
    attention.py      reshape_and_cache, paged_attention (CPU and CUDA kernels)
    layer_ops.py      rms_norm, rotary, silu_and_mul (native on CPU, torch elsewhere)
    linear.py         packed_linear, packed_gated_linear, weight packing (bf16 / fp32, ISA avx2+)
    decoder_stack.py  NativeDecoderStack: every layer of a step in one native call

Nothing here imports pagedserve.core.models: the models import these ops. This file imports
nothing, so that `ops.native` stays importable without torch.
"""
