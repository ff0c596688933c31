"""The grader's hands inside a sandboxed kernel: run one call of a learner's function, describe a name.

Imported into the kernel by ``specdec.course.trusted`` before the notebook runs. Nothing here decides a score: the
trusted grader, outside the sandbox, sends the inputs, reads what comes back through ``specdec.course.channel`` (which
rebuilds only data) and judges it. A submission that replaces this module can only send back wrong answers.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import random
import traceback
from pathlib import Path
from typing import Any

import torch

from specdec import instruments
from specdec.course import channel


def _namespace() -> dict[str, Any]:
    from IPython import get_ipython

    return get_ipython().user_ns


def _shared(keys: list[str]) -> dict[str, Any]:
    ns = _namespace()
    return {key: ns[key] for key in keys if key in ns}


def describe(request_path: str, response_path: str) -> None:
    """For each requested name: missing, a function, a Triton kernel (with its source) or a value (sent as data)."""
    request = json.loads(Path(request_path).read_text())
    ns, out = _namespace(), {}
    for name in request["names"]:
        if name not in ns:
            out[name] = {"kind": "missing"}
            continue
        value = ns[name]
        if hasattr(value, "fn") and hasattr(value, "__getitem__"):
            try:
                src = inspect.getsource(value.fn)  # with its @triton.jit line, as the compile check wants it
            except (OSError, TypeError):
                src = getattr(value, "src", "")
            out[name] = {"kind": "kernel", "src": src}
        elif callable(value):
            out[name] = {"kind": "function", "name": str(getattr(value, "__name__", name))}
        else:
            try:
                out[name] = {"kind": "value", "value": channel.Encoder({id(v): k for k, v in _shared(
                    request["shared"]).items()})(value)}
            except channel.ChannelError as err:
                out[name] = {"kind": "value", "value": {"x": type(value).__name__, "repr": str(err)}}
    Path(response_path).write_text(json.dumps(out))


def serve(request_path: str, response_path: str) -> None:
    """Run the call in ``request_path`` and write what happened to ``response_path``."""
    message = json.loads(Path(request_path).read_text())
    shared = _shared(message["shared"])
    request = channel.Decoder(shared)(message["call"])
    name, grid = request["target"]
    fn = _namespace()[name]
    if grid is not None:
        fn = fn[grid]
    torch.set_rng_state(request["rng"])
    random.setstate(request["py_random"])
    outcome: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        measured = [instruments.enter(stack, n, params) for n, params in request["instruments"]]
        try:
            outcome["result"] = fn(*request["args"], **request["kwargs"])
        except Exception as err:  # reported to the grader, which raises the same kind of error there
            frames = traceback.extract_tb(err.__traceback__)
            outcome["raised"] = {"type": type(err).__name__, "message": str(err)[:4000],
                                 "where": frames[-1].name if frames else "",
                                 "cause": type(err.__cause__).__name__ if err.__cause__ else ""}
    outcome.update(args=request["args"], kwargs=request["kwargs"], rng=torch.get_rng_state(),
                   py_random=random.getstate(), measured=measured)
    encoder = channel.Encoder({id(v): k for k, v in shared.items()})
    try:
        text = json.dumps(encoder(outcome), allow_nan=False)
    except (channel.ChannelError, ValueError) as err:
        text = json.dumps(channel.Encoder()({"raised": {"type": "TypeError", "where": "", "cause": "",
                                                        "message": f"the grader cannot read what it returned: {err}"},
                                             "args": [], "kwargs": {}, "rng": torch.get_rng_state(),
                                             "py_random": random.getstate(), "measured": []}))
    Path(response_path).write_text(text)
