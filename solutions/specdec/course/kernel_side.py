"""The grader's hands inside a sandboxed kernel: a session per test cell that describes the learner's names and runs
their functions on the grader's inputs, and the stand-ins (``channel.Callback``) through which those functions reach
what the grader handed over.

Imported into the kernel by ``specdec.course.trusted`` before the notebook runs. Nothing here decides a score: the
trusted grader, outside the sandbox, sends the inputs, reads what comes back through ``specdec.course.channel`` (which
rebuilds only data) and judges it. A submission that replaces this module can only send back wrong answers, and a
grader that gets no answer, or a malformed one, holds the submission for review.
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import json
import random
import socket
import traceback
from typing import Any

import torch

from specdec.course import channel, instruments


def _namespace() -> dict[str, Any]:
    from IPython import get_ipython

    return get_ipython().user_ns


def _shared(keys: list[str]) -> dict[str, Any]:
    ns = _namespace()
    return {key: ns[key] for key in keys if key in ns}


class _Context:
    """The session now open with the grader, and the models shared by key in the call it runs."""

    shared: dict[str, Any] = {}
    connection: socket.socket | None = None
    proxies: dict[str, channel.Callback] = {}
    originals: dict[int, Any] = {}  # the call's objects as decoded here, by the grader's numbers


def _origins() -> dict[int, int]:
    return {id(v): n for n, v in _Context.originals.items()}


def _proxy(data: dict) -> channel.Callback:
    key = str(data["h"])
    if key not in _Context.proxies:
        methods = frozenset(str(m) for m in data.get("methods", []) if isinstance(m, str))
        _Context.proxies[key] = channel.Callback(key, str(data.get("name", "an object of the grader's")), methods, _ask)
    return _Context.proxies[key]


def _ask(key: str, op: str, name: str, args: tuple, kwargs: dict) -> Any:
    """Ask the grader to run one operation on the object behind handle ``key`` (see ``channel.Callback``)."""
    with instruments.paused():  # the channel's own torch calls are not the learner's
        return _ask_grader(key, op, name, args, kwargs)


def _ask_grader(key: str, op: str, name: str, args: tuple, kwargs: dict) -> Any:
    if _Context.connection is None:
        raise RuntimeError("the grader's objects answer only while the grader runs a test")
    shared_ids = {id(v): k for k, v in _Context.shared.items()}
    call = channel.Encoder(shared_ids, origins=_origins())({
        "args": list(args), "kwargs": dict(kwargs), "rng": torch.get_rng_state(), "py_random": random.getstate(),
        "grad": torch.is_grad_enabled()})
    channel.send(_Context.connection, json.dumps({"callback": {"h": key, "op": op, "name": name, "call": call}}))
    answer = channel.receive(_Context.connection)
    if answer is None:
        raise RuntimeError("the grader closed the connection")
    outcome = channel.Decoder(_Context.shared, callbacks=_proxy, originals=_Context.originals,
                               trusted_sender=True)(answer)
    seen: dict[int, Any] = {}
    for old, new in zip(args, outcome.get("args", [])):
        channel.update_in_place(old, new, seen)
    for k, old in kwargs.items():
        if k in outcome.get("kwargs", {}):
            channel.update_in_place(old, outcome["kwargs"][k], seen)
    if "rng" in outcome:
        torch.set_rng_state(outcome["rng"])
        random.setstate(outcome["py_random"])
    if "raised" in outcome:
        kind = getattr(builtins, str(outcome["raised"].get("type")), None)
        message = str(outcome["raised"].get("message", ""))
        error: Exception = RuntimeError(f"{outcome['raised'].get('type')}: {message}")
        if isinstance(kind, type) and issubclass(kind, Exception):
            with contextlib.suppress(TypeError):  # an exception class whose constructor wants more
                error = kind(message)
        raise error
    return channel.substitute(outcome.get("result"), seen)


def session(path: str) -> None:
    """Answer the grader on its socket (``path``) until it says the test cell is done."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    _Context.connection = connection
    try:
        while isinstance(message := channel.receive(connection), dict) and message.get("op") != "end":
            answer = describe(message) if message.get("op") == "describe" else serve(message)
            channel.send(connection, answer)
    finally:
        connection.close()
        _Context.connection = None


def describe(request: dict) -> str:
    """For each requested name: missing, a function, a Triton kernel (with its source) or a value (sent as data)."""
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
    return json.dumps({"answer": out})


def serve(message: dict) -> str:
    """Run the call in ``message``; what happened, as the grader's answer."""
    shared = _shared(message["shared"])
    _Context.shared = shared
    decoder = channel.Decoder(shared, callbacks=_proxy, trusted_sender=True)
    request = decoder(message["call"])
    _Context.originals = decoder.objects  # the grader's objects, by its numbers: they go back as themselves
    name, grid = request["target"]
    fn = _namespace()[name]
    if grid is not None:
        fn = fn[grid]
    torch.set_rng_state(request["rng"])
    random.setstate(request["py_random"])
    outcome: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.set_grad_enabled(bool(request.get("grad", True))))
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
    encoder = channel.Encoder({id(v): k for k, v in shared.items()}, origins=_origins())
    try:
        return json.dumps({"answer": encoder(outcome)}, allow_nan=False)
    except (channel.ChannelError, ValueError) as err:
        return json.dumps({"answer": channel.Encoder()({
            "raised": {"type": "TypeError", "where": "", "cause": "",
                       "message": f"the grader cannot read what it returned: {err}"},
            "args": [], "kwargs": {}, "rng": torch.get_rng_state(), "py_random": random.getstate(), "measured": []})})
