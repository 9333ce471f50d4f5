"""Which name codeckv's own kernels package has here, and its modules (codeckv/cache/kernel_ops.py says why).

    kernel_module("ans_cpu")   # kernels/ans_cpu.py, imported as codeckv_kernels.ans_cpu or kernels.ans_cpu
    package_name()             # "codeckv_kernels" (an installed wheel) or "kernels" (a checkout)

The package is taken only from the folder beside codeckv: `codeckv_kernels`, else `kernels`. If the `kernels`
found first is someone else's (the Hugging Face hub's, earlier on sys.path than a checkout), this fails saying
so instead of running the wrong code. A leaf: it imports no other codeckv module, so every layer may use it (the
cache's kernel ops, the codecs' entropy coder); modules are imported at their first use.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

PACKAGE_NAMES = ("codeckv_kernels", "kernels")  # the installed wheel's name first, then the checkout's
_HOME = Path(__file__).resolve().parents[1]  # the folder holding codeckv/ (site-packages or the checkout)


@functools.cache
def package_name() -> str:
    """The name under which codeckv's own kernels package imports here (ImportError where it does not)."""
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


def kernel_module(name: str) -> ModuleType:
    """The kernels package's module `name` (kernels/<name>.py), under the package's name here."""
    return importlib.import_module(f"{package_name()}.{name}")
