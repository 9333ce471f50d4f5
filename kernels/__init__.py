"""Kernels on stored KV codes: Triton on CUDA, the torch reference everywhere else.

    enc = encode(x, codec)                # any codec: exactly the Encoded codec.encode(x) returns
    x = decode(enc, codec)                # its decode
    enc = dct_encode(x, codec)            # the block-DCT encoder (a layout with block > 1) ...
    enc = rotate_quant(x, codec)          # ... or the rotation + quantizer one (block 1); their decoders:
    x = dct_decode(enc, codec); x = dequant_rotate(enc, codec)
    out = decode_attention(q, [Raw(k0, v0), Coded(kc, k_enc, vc, v_enc), Raw(k1, v1)])  # (B, Hq, T, Dv)
    attention_compiled(kc, vc, head_dim)  # True: on the CPU both sides are read by the compiled kernel

The kernels read the row layout each codec declares (`codec.row_layout()`, kernels/layout.py) and
import no codec class. Every op dispatches on `tensor.is_cuda`: the Triton kernel on a GPU when the
codec's layout allows it (and, for attention, when no mask is given), else torch: the codec's own
encode / decode, and for attention decode_attention_torch (kernels/decode_attention_torch.py, the fast
path the CPU uses, which hands integer codes to a compiled C kernel, kernels/codes_cpu.py, where a C
compiler is found) or, for a codec without a row layout, the reference; `backend_name(device, codec)`
says which one a tensor gets, and why for the torch path.

The ops live in kernels/ops.py and this package imports nothing until one of these names is used
(PEP 562): transformers probes for the Hugging Face kernel hub by importing whatever top-level
package is called `kernels`, and an eager import of codeckv (hence transformers) from here would
re-enter transformers half-imported. `from kernels.ops import decode_attention` always works; the
package-level names are bound once kernels.ops is imported (they share names with the submodules).

Its name: a checkout imports this folder as `kernels`; the wheel installs it as `codeckv_kernels`,
leaving `kernels` to the hub's package of that name (its files import each other relatively, so the
code is the same under both names). codeckv reaches it only through codeckv/cache/kernel_ops.py, which
says why and checks that the package it imports is the one beside codeckv.
"""

__all__ = [
    "Coded",
    "Raw",
    "Segment",
    "attention_compiled",
    "backend_name",
    "dct_decode",
    "dct_encode",
    "decode",
    "decode_attention",
    "dequant_rotate",
    "encode",
    "rotate_quant",
]


def __getattr__(name: str):
    if name in __all__:
        from . import ops  # binds every public name into this package

        return getattr(ops, name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")
