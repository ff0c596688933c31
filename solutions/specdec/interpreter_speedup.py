"""Triton's CPU interpreter, about twice as fast on the course's kernels.

The interpreter (``TRITON_INTERPRET=1``) runs a kernel's grid one program at a time in Python. Every call of a
device function inside it (``tl.max``, ``tl.argmax``, ``tl.sum`` are Triton functions of ``triton.language.standard``)
first re-patches all of ``triton.language`` for interpretation, walking every member of its modules: about 4 ms a
call, half of the time of a small kernel such as the race (measured with Triton 3.9 on this course's CPU). Within
one launch that patching is the same every time (the device function's patches are never undone before the launch
ends), so :func:`install` makes each module's patching happen once per launch. Kernels compute exactly what they
computed before; only the repeated bookkeeping goes. Without the interpreter (a GPU), nothing is changed.
"""

from __future__ import annotations

import functools


def install() -> bool:
    """Patch Triton's interpreter as above; False (and nothing changed) when its internals are not as expected."""
    try:
        from triton.runtime import interpreter
        launch = interpreter.GridExecutor.__call__
        patch_lang = interpreter._patch_lang
        interpreter._LangPatchScope  # noqa: B018 (the scope type the launch restores)
    except (ImportError, AttributeError):
        return False
    if getattr(launch, "_specdec_once", False):
        return True
    patched: set[int] = set()  # the modules whose globals were patched in the running launch

    class _NothingToRestore:
        def restore(self) -> None:
            pass

    def patch_once(fn):
        key = id(fn.__globals__)
        if key in patched:
            return _NothingToRestore()
        patched.add(key)
        return patch_lang(fn)

    @functools.wraps(launch)
    def launch_with_one_patch_per_module(self, *args, **kwargs):
        patched.clear()
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.clear()

    launch_with_one_patch_per_module._specdec_once = True
    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch_with_one_patch_per_module
    return True
