"""Where a model's tensors live, and how to time work on a device that runs asynchronously.

The library's rule: a tensor that meets a model's outputs is created on the model's device, a generator on the
device where its draws happen (the logits' device), and a cache where the model writes it. The course's loops
(notebooks 05-07) create their tensors without a device, as learners write them; :func:`on_device` runs them
where the model is. A clock read after launching GPU work measures the launch, not the work: :func:`synchronize`
first. Triton publishes wheels for Linux only, so a Mac or native Windows install has none (``pyproject.toml`` asks
for it on Linux alone): only notebook 08's kernels need it, and :data:`TRITON_NEEDED` is what a learner reads
instead of a traceback.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable

import torch

#: device type -> how to wait for the work queued on such a device (types not listed run synchronously, as the CPU).
WAITS: dict[str, Callable[[torch.device], None]] = {
    "cuda": lambda device: torch.cuda.synchronize(device),
    "xpu": lambda device: torch.xpu.synchronize(device),
    "mps": lambda device: torch.mps.synchronize(),
}


def model_device(model) -> torch.device:
    """The device of ``model``'s parameters: where its forward runs (the CPU for a model without parameters)."""
    parameters = getattr(model, "parameters", None)
    parameter = next(iter(parameters()), None) if parameters is not None else None
    return parameter.device if parameter is not None else torch.device("cpu")


def logits_device(model) -> torch.device:
    """Where ``model(tokens, cache)`` returns its logits, so where sampling from them happens: the parameters'
    device, unless the model says otherwise (:class:`specdec.models.pretrained.PretrainedLM` returns them on the
    host)."""
    return getattr(model, "logits_device", None) or model_device(model)


def synchronize(device: torch.device | str) -> None:
    """Wait until the work queued on ``device`` is done (a CUDA kernel runs after its launch returns); nothing to
    wait for on the CPU. Call it before each clock read that ends (or starts) a timed stretch of device work."""
    device = torch.device(device)
    wait = WAITS.get(device.type)
    if wait is not None:
        wait(device)


def on_device(device: torch.device | str) -> contextlib.AbstractContextManager:
    """A block in which tensors created without a device go to ``device``: ``torch.device(device)``, or nothing
    when that is already the default (on the CPU, as a rule: the block then changes nothing and costs nothing)."""
    device = torch.device(device)
    return contextlib.nullcontext() if torch.get_default_device() == device else device


#: The notebooks whose code needs Triton.
NEEDS_TRITON = ("08_gpu_kernels",)

TRITON_NEEDED = ("Notebook 08's kernels need Triton, which publishes wheels for Linux only: run notebook 08 on Linux "
                 "(the course's container or dev container, WSL on Windows, a Linux VM or a hosted Linux notebook); "
                 "every other notebook runs here.")


def triton_installed() -> bool:
    """Whether ``import triton`` can find the package (without importing it: that must wait for
    ``specdec.kernels``, which decides about the interpreter first)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except ImportError:  # a finder that refuses it, as on a machine without it
        return False
