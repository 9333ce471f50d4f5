"""The kernel ops codeckv uses, from the kernels package that sits beside codeckv (the only way codeckv reaches it).

    from codeckv.cache.kernel_ops import decode_attention, encode, decode, backend_name, op_backends, layout_of
    from codeckv.cache.kernel_ops import attention_compiled
    from codeckv.cache.kernel_ops import ans_available, ans_encode, ans_costs, ans_status   # the PCA coder's C

Why the indirection: the Hugging Face hub has a package named `kernels` too (PyPI `kernels`, which
transformers probes for). Two top-level `kernels` packages cannot be installed side by side (the
second overwrites the first's files), so the wheel ships this repository's `kernels/` folder as
`codeckv_kernels` (pyproject.toml, `package-dir`) and leaves the name `kernels` to the hub. A checkout
keeps the folder as `kernels` (its tests and `python -m kernels.bench` import it so); the kernel files
import each other relatively, so the same code works under both names.

Whichever name it has, the package is taken only from the folder beside codeckv: `codeckv_kernels`
(an installed wheel), else `kernels` (a checkout, or an editable install that maps either name
there). If the `kernels` found first is someone else's (the hub's, earlier on sys.path than a
checkout), importing this module fails saying so, instead of running the wrong code.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

PACKAGE_NAMES = ("codeckv_kernels", "kernels")  # the installed wheel's name first, then the checkout's
_HOME = Path(__file__).resolve().parents[2]  # the folder holding codeckv/ (site-packages or the checkout)


def _package_name() -> str:
    """The name under which codeckv's own kernels package imports here."""
    found = {}
    for name in PACKAGE_NAMES:
        spec = importlib.util.find_spec(name)
        origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if origin is not None and origin.parent.parent == _HOME:
            return name
        found[name] = origin
    shadow = f"; `kernels` here is {found['kernels'].parent}, not codeckv's" if found.get("kernels") else ""
    raise ImportError(
        f"codeckv's kernels are not importable beside {_HOME / 'codeckv'} (looked for "
        f"{' and '.join(f'{_HOME / n}' for n in PACKAGE_NAMES)}){shadow}: reinstall the codeckv wheel, "
        "or run from the checkout's root so that its kernels/ comes first on sys.path"
    )


PACKAGE = _package_name()
_ops = importlib.import_module(f"{PACKAGE}.ops")
_layout = importlib.import_module(f"{PACKAGE}.layout")
_ans = importlib.import_module(f"{PACKAGE}.ans_cpu")

ans_available = _ans.ans_available
ans_costs = _ans.ans_costs
ans_encode = _ans.ans_encode
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
