"""Instruments a check runs a learner's function under: fixed uniforms, counted kernel loads, counted torch
calls, silenced warnings.

They change how the function's own process behaves (``torch.rand`` returns a fixed value; the Triton interpreter
counts loads), so when cohort grading runs the function in a sandboxed kernel (``specdec.course.trusted``) the same
instrument must be entered there. Each one, while active, is listed in :data:`ACTIVE` with what it needs, and the
grader's proxy enters the same instruments around the call in the kernel and adds what they measured to the caller's.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def _as_is(cmd: list[str], env: dict[str, str]) -> list[str]:
    return cmd


#: How a check starts a process that runs a learner's code (Triton's compiler on their kernel's source): as it is,
#: or, when cohort grading sets it, inside the submission's sandbox with ``env`` set there.
untrusted_command = _as_is

#: (name, parameters, results) of every instrument now entered, innermost last.
ACTIVE: list[tuple[str, dict[str, Any], dict[str, int] | None]] = []


@contextlib.contextmanager
def _listed(name: str, params: dict[str, Any], results: dict[str, int] | None = None) -> Iterator[None]:
    ACTIVE.append((name, params, results))
    try:
        yield
    finally:
        ACTIVE.pop()


@contextlib.contextmanager
def fixed_uniforms(top: bool) -> Iterator[None]:
    """Every uniform drawn with torch.rand, torch.rand_like or Tensor.uniform_ is 0 (``top`` False) or the largest
    value below 1 of its dtype (``top`` True). torch.multinomial is left as it is."""
    rand, rand_like, uniform_ = torch.rand, torch.rand_like, torch.Tensor.uniform_

    def level(dtype: torch.dtype) -> float:
        return 1.0 - torch.finfo(dtype).eps / 2 if top else 0.0

    def fixed(*size, generator=None, dtype=None, device=None, out=None, **_):
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        dtype = dtype or torch.get_default_dtype()
        return torch.full(shape, level(dtype), dtype=dtype, device=device)

    def fixed_like(input, *, dtype=None, **_):
        dtype = dtype or input.dtype
        return torch.full_like(input, level(dtype), dtype=dtype)

    def fill(self, low=0.0, high=1.0, *, generator=None):
        return self.fill_(low + (high - low) * level(self.dtype))

    torch.rand, torch.rand_like, torch.Tensor.uniform_ = fixed, fixed_like, fill
    try:
        with _listed("fixed_uniforms", {"top": top}):
            yield
    finally:
        torch.rand, torch.rand_like, torch.Tensor.uniform_ = rand, rand_like, uniform_


@contextlib.contextmanager
def loads_counted(watched: dict[str, torch.Tensor], on_cpu: bool = True) -> Iterator[dict[str, int]]:
    """Counts, per watched tensor, the elements the Triton interpreter loads from it while inside (masked-off lanes do
    not count). Yields the counts; empty when ``on_cpu`` is False (compiled kernels on a GPU cannot be counted)."""
    counts = {name: 0 for name in watched}
    if not on_cpu:
        yield {}
        return
    from triton.runtime.interpreter import InterpreterBuilder

    ranges = {name: (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for name, t in watched.items()}
    original = InterpreterBuilder.create_masked_load

    def counting(self, ptrs, mask, *rest, **options):  # the cache and eviction arguments differ between releases
        addresses = np.asarray(ptrs.data)[np.asarray(mask.data, dtype=bool)]
        for name, (start, end) in ranges.items():
            counts[name] += int(((addresses >= start) & (addresses < end)).sum())
        return original(self, ptrs, mask, *rest, **options)

    InterpreterBuilder.create_masked_load = counting
    try:
        with _listed("loads_counted", {"watched": watched}, counts):
            yield counts
    finally:
        InterpreterBuilder.create_masked_load = original


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No warnings on stderr (the Triton interpreter's numpy on log(0) or an overflow): a graded cell must stay quiet."""
    with warnings.catch_warnings(), np.errstate(all="ignore"), _listed("quiet", {}):
        warnings.simplefilter("ignore")
        yield


class _Paused:
    depth = 0


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Inside, :func:`torch_calls` counts nothing: the grader's own work around a call into the sandbox (encoding
    the arguments) is not the learner's."""
    _Paused.depth += 1
    try:
        yield
    finally:
        _Paused.depth -= 1


@contextlib.contextmanager
def torch_calls() -> Iterator[dict[str, int]]:
    """Counts, by name, the torch functions and tensor methods called while inside (to spot Python loops, or a tensor
    turned into Python values). Yields the counts."""
    from torch.overrides import TorchFunctionMode

    counts: dict[str, int] = {}

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if not _Paused.depth:
                name = getattr(func, "__name__", str(func))
                counts[name] = counts.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    with Count(), _listed("torch_calls", {}, counts):
        yield counts


def enter(stack: contextlib.ExitStack, name: str, params: dict[str, Any]) -> dict[str, int] | None:
    """Enter the instrument ``name`` (as listed in ACTIVE elsewhere) on ``stack``; what it will measure, if anything."""
    if name == "fixed_uniforms":
        stack.enter_context(fixed_uniforms(bool(params["top"])))
        return None
    if name == "loads_counted":
        return stack.enter_context(loads_counted(params["watched"]))
    if name == "quiet":
        stack.enter_context(quiet())
        return None
    if name == "torch_calls":
        return stack.enter_context(torch_calls())
    raise ValueError(f"unknown instrument {name!r}")
