"""A fix for Triton's CPU interpreter (TRITON_INTERPRET=1, how CI runs every Triton kernel),
applied on import; every module of Triton kernels imports this one."""

from __future__ import annotations

import os


def _interpreter_numpy_compat() -> None:
    """TRITON_INTERPRET with numpy >= 2.4: triton 3.6's interpreter converts a scalar tensor to an
    index with `int(array_of_shape_1)`, which numpy 2.4 rejects, so `range(lo, hi)` with bounds
    loaded from memory fails (triton-lang/triton#9171). Re-patch `__index__` to take the element.
    Only touches the interpreter (CPU) path; compiled kernels are unaffected."""
    try:
        from triton.runtime import interpreter as _interp
    except ImportError:  # pragma: no cover - layout of a different triton version
        return
    orig = getattr(_interp, "_patch_lang_tensor", None)
    if orig is None or getattr(orig, "_hotspec_index_fix", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._hotspec_index_fix = True  # type: ignore[attr-defined]  # a function attribute
    _interp._patch_lang_tensor = patched


if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    _interpreter_numpy_compat()
