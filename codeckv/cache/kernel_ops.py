"""The kernel ops codeckv's cache uses, from the kernels package that sits beside codeckv.

    from codeckv.cache.kernel_ops import decode_attention, encode, decode, backend_name, op_backends, layout_of
    from codeckv.cache.kernel_ops import attention_compiled
    from codeckv.cache.kernel_ops import ans_status   # which entropy coder the PCA tiers run (kernels/ans_cpu.py)

Why the indirection: the Hugging Face hub has a package named `kernels` too (PyPI `kernels`, which
transformers probes for). Two top-level `kernels` packages cannot be installed side by side (the
second overwrites the first's files), so the wheel ships this repository's `kernels/` folder as
`codeckv_kernels` (pyproject.toml, `package-dir`) and leaves the name `kernels` to the hub. A checkout
keeps the folder as `kernels` (its tests and `python -m kernels.bench` import it so); the kernel files
import each other relatively, so the same code works under both names.

Whichever name it has, the package is taken only from the folder beside codeckv: `codeckv_kernels`
(an installed wheel), else `kernels` (a checkout, or an editable install that maps either name
there). If the `kernels` found first is someone else's (the hub's, earlier on sys.path than a
checkout), importing this module fails saying so, instead of running the wrong code. Finding it is
codeckv/kernel_package.py's job, a leaf any layer may import: the codecs' entropy coder (codecs/ans.py,
codecs/pca.py) reaches kernels/ans_cpu.py through it, since the codecs sit below this cache layer.
"""

from __future__ import annotations

from codeckv.kernel_package import kernel_module, package_name

PACKAGE = package_name()
_ops = kernel_module("ops")
_layout = kernel_module("layout")
_ans = kernel_module("ans_cpu")

ans_status = _ans.ans_status
attention_compiled = _ops.attention_compiled
Coded = _ops.Coded
Raw = _ops.Raw
Segment = _ops.Segment
backend_name = _ops.backend_name
op_backends = _ops.op_backends
decode = _ops.decode
decode_attention = _ops.decode_attention
encode = _ops.encode
layout_of = _layout.layout_of
