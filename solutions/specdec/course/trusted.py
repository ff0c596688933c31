"""Autograde with the verdict outside the learner's reach: ``TrustedExecute`` replaces nbgrader's ``Execute``.

nbgrader runs every cell in the learner's kernel and scores a test cell by whether it raised there, so anything in the
kernel (a patched check, an IPython hook, a forged exception) decides the score. Here the kernel runs in a sandbox
(``specdec.course.sandbox``) and only the learner's cells run in it. Each graded test cell runs in this process, the
grader's, in a namespace built from the course's own locked cells (run here, from the instructor notebook), where
every name the learner defined is a :class:`Remote` proxy: calling it sends the arguments into the kernel, runs the
learner's function there, and brings back the result, the arguments as the function left them and the generator
states, as data (``specdec.course.channel``). The checks, the references and the gradebook never enter the sandbox,
and what the test cell prints or raises, which nbgrader then scores, is produced here.

Configured by the environment variable ``SPECDEC_SANDBOX`` (a JSON file: the submission's folder, the graded build,
the limits), which cohort grading writes; nbgrader's ``SaveAutoGrades`` and the rest of autograde run as usual.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import io
import json
import os
import random
import re
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import torch
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.manager import AsyncKernelManager
from nbclient.util import run_sync
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Unicode

from specdec.checks.seeds import SALT_VARIABLE
from specdec.course import channel, instruments, sandbox
from specdec.course.driver import source_notebook
from specdec.course.reference_calls import parse_cell


def settings() -> dict:
    return json.loads(Path(os.environ["SPECDEC_SANDBOX"]).read_text())


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel started inside the submission's sandbox, talking over Unix sockets in the submission's folder."""

    sandbox_dir = Unicode("")

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        conf = settings()
        own = Path(conf["own"])
        limits = sandbox.Limits(**conf["limits"])
        env = {"OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1", "JUPYTER_RUNTIME_DIR": str(own / "runtime"),
               "IPYTHONDIR": str(own / "ipython")}
        return sandbox.command(own, Path(conf["build"]), cmd, limits, env)

    async def interrupt_kernel(self) -> None:  # type: ignore[override]
        """bubblewrap passes no signal on to the kernel it runs, so SIGINT would never arrive: ask the kernel to
        interrupt itself (ipykernel's interrupt_request), as a kernel with interrupt_mode "message" is asked."""
        if self.has_kernel:
            self._connect_control_socket()
            self.session.send(self._control_socket, self.session.msg("interrupt_request", content={}))


class RemoteError(Exception):
    """An exception the learner's function raised in the sandbox, of a kind that has no builtin name."""


def _exception(raised: dict) -> BaseException:
    kind = getattr(builtins, str(raised.get("type")), None)
    message = str(raised.get("message", ""))
    if isinstance(kind, type) and issubclass(kind, Exception) and kind is not KeyboardInterrupt:
        try:
            return kind(message)
        except Exception:  # an exception class whose constructor wants more
            pass
    return RemoteError(f"{raised.get('type')}: {message}")


#: Frames of the grader's own code (the trusted side, the channel, the checks): a learner's feedback leaves them out.
_GRADER_FILES = re.compile(r"[/\\]specdec[/\\](course|checks|mistakes)[/\\]")


def learner_traceback(error: BaseException, exercise: str) -> list[str]:
    """The traceback a learner reads: a first line naming the exercise and the cause, then only the test cell's
    frames and the learner's function that raised (the grader's own frames left out), then the error."""
    kept, raised_in = [], ""
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename == "<string>" and frame.name not in ("<module>", "raise_it"):  # _raise_in's stand-in frame
            raised_in = frame.name
        elif not _GRADER_FILES.search(frame.filename):
            kept.append(frame)
    cause = (f"{raised_in or 'your function'} still raises NotImplementedError: not done yet"
             if isinstance(error, NotImplementedError) else (str(error).splitlines() or [type(error).__name__])[0])
    lines = [f"{exercise}: {cause[:300]}" if exercise else cause[:300], "Traceback (most recent call last):"]
    lines += [entry.rstrip("\n") for entry in traceback.format_list(kept)]
    if raised_in:
        lines.append(f"  raised in {raised_in}(...), your function, run in the notebook's kernel")
    lines += [entry.rstrip("\n") for entry in traceback.format_exception_only(type(error), error)]
    return lines


def _raise_in(where: str, err: BaseException) -> None:
    """Raise err from a frame named ``where`` (the learner's function that raised it), so that the checks' messages
    name the function as they do when it runs in their own process."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", where or "") or where in ("raise_it",):
        raise err
    scope: dict[str, Any] = {}
    exec(f"def {where}(err):\n    raise err", scope)  # a frame named like the learner's function
    scope[where](err)


class Remote:
    """A name the learner defined, living in the sandboxed kernel."""

    def __init__(self, client: Grader, name: str, info: dict):
        self._client, self.__name__, self._info = client, name, info
        if info["kind"] == "kernel":
            self.src = info.get("src", "")
            self.fn = _NamedStub(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._client.call(self.__name__, None, args, kwargs)

    def __getitem__(self, grid: Any) -> Any:
        if self._info["kind"] != "kernel":
            raise TypeError(f"{self.__name__} is not subscriptable")
        return lambda *args, **kwargs: self._client.call(self.__name__, grid, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("fn", "src"):
            raise AttributeError(name)
        raise AttributeError(f"{self.__name__} (the learner's, graded from outside its kernel) has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"<the learner's {self.__name__}>"


class _NamedStub:
    def __init__(self, name: str):
        self.__name__ = name


CALLBACK_OPS = ("call", "method", "getattr", "getitem", "len", "bool", "iter")


def _plain_data(message: Any) -> bool:
    """True when an encoded value names no function, handle or object (a skeleton's ``count_params = None``)."""
    if isinstance(message, dict):
        return not ({"fn", "h", "o", "x", "ref"} & set(message)) and all(_plain_data(v) for v in message.values())
    if isinstance(message, list):
        return all(_plain_data(v) for v in message)
    return True


def _plain(value: Any, depth: int = 0) -> bool:
    """Data: numbers, text, tensors, dtypes and the containers and dataclasses of the course (configs) made of them."""
    if depth > 8:
        return False
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, torch.Tensor, torch.dtype,
                                           torch.device, torch.Size)):
        return True  # a tensor (a model's weight too) crosses as a copy of its data
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return all(_plain(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value))
    return False


def _operate(target: Any, op: str, name: str, args: list, kwargs: dict) -> Any:
    """One operation of channel.Callback on the object it stands for; public attributes only, never a module."""
    if op == "call":
        return target(*args, **kwargs)
    if op in ("method", "getattr"):
        if not channel.PUBLIC_NAME.fullmatch(name):
            raise AttributeError(f"{name!r}: only public attributes of the grader's objects can be read")
        if isinstance(target, torch.nn.Module) and getattr(type(target), name, None) is getattr(torch.nn.Module, name,
                                                                                                 object()):
            # load_state_dict, register_forward_hook, to, half, apply, train...: a model's machinery, which would
            # change the grader's model for every check after this one; a kernel calls the model's own methods only
            raise AttributeError(f"{name!r}: torch.nn.Module's own methods of the grader's model are not called from "
                                 "the sandbox")
        value = getattr(target, name)
        if isinstance(value, type(sys)):
            raise AttributeError(f"{name!r} is a module")
        if op == "getattr" and not (_plain(value) or channel.needs_handle(value)):
            # data, or what goes back as a handle (a model, whose calls the grader runs and counts); never an object
            # copied into the kernel (the model behind a counting wrapper, called there uncounted)
            raise AttributeError(f"{name!r}: the grader hands over data attributes and models by handle, not copies of "
                                 f"the objects behind them ({type(value).__name__})")
        return value(*args, **kwargs) if op == "method" else value
    if op == "getitem":
        return target[args[0]]
    if op == "len":
        return len(target)
    if op == "bool":
        return bool(target)
    return list(target)


class Grader:
    """Calls into one sandboxed kernel, and judges test cells in this process."""

    def __init__(self, connection: dict, own: Path, timeout_s: float, alive: Callable[[], bool]):
        self.alive = alive
        self.client = BlockingKernelClient()
        self.client.load_connection_info(connection)
        self.client.start_channels()
        self.own, self.timeout_s = own, timeout_s
        self.deadline = float("inf")
        self.shared: dict[str, Any] = {}
        self.refused: frozenset[str] = frozenset()  # the graded exercises: their references never cross by name
        self.forged: set[str] = set()  # answers the kernel described as something other than a function
        self.handles: dict[str, Any] = {}  # what this grader handed the kernel by handle (channel.Callback)
        self._handle_keys: dict[int, str] = {}
        self._handles_made = 0  # keys never repeat, so a proxy kept from an earlier cell finds nothing
        self.socket_path = own / "grader.sock"
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(self.socket_path))  # the kernel's box runs as this process's uid, outside its namespace
        self.server.listen(1)
        self.conn: socket.socket | None = None  # the kernel's side of the session now open
        self.sent: dict[int, Any] = {}  # the objects the call now running sent into the kernel, by number
        self.session_id = ""  # the execute request that runs the kernel's session

    def close(self) -> None:
        self.end_session()
        self.client.stop_channels()
        self.server.close()

    def forget_handles(self) -> None:
        """Drop what was handed over for one test cell (a proxy kept in the kernel after it answers nothing)."""
        self.handles.clear()
        self._handle_keys.clear()

    def _handle(self, value: Any) -> dict:
        key = self._handle_keys.get(id(value))
        if key is None:
            key = self._handle_keys[id(value)] = f"h{self._handles_made}"
            self._handles_made += 1
            self.handles[key] = value
        return {"h": key, "name": str(getattr(value, "__name__", type(value).__name__))[:200],
                "methods": channel.public_methods(value)}

    # -- the session: one execute request in the kernel, many calls over a socket ---------------------------------
    # Each test cell opens a session: the kernel runs kernel_side.session(), which connects to this grader's socket
    # and answers requests (describe, serve) until told the cell is done. A learner's function that calls back (a
    # Callback) sends its question on the same connection and waits for the answer. So a check that calls the
    # learner's function ten thousand times costs ten thousand socket round trips, not ten thousand executes.

    def _session(self) -> socket.socket:
        if self.conn is not None:
            return self.conn
        self.session_id = self.client.execute(f"__specdec_grader__.session({str(self.socket_path)!r})",
                                              store_history=False, allow_stdin=False)
        self.server.settimeout(0.1)
        while True:
            self._check_time()
            try:
                self.conn, _ = self.server.accept()
                break
            except TimeoutError:
                if self._drain(wait=0):  # the session ended without connecting
                    raise RuntimeError("the kernel gave no answer (was the grader's helper in the kernel replaced?)")
        return self.conn

    def end_session(self) -> None:
        """Tell the kernel the cell is done and wait until it is idle, copying what it printed."""
        if self.conn is None:
            return
        with contextlib.suppress(OSError):
            channel.send(self.conn, json.dumps({"op": "end"}))
        self.conn.close()
        self.conn = None
        with contextlib.suppress(RuntimeError, TimeoutError):
            self._drain(wait=5.0)

    def _drain(self, wait: float) -> bool:
        """Read the session's iopub messages for up to ``wait`` seconds: copy streams, raise on errors; True once the
        session's execute request is done (the kernel idle)."""
        until = time.monotonic() + wait
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=max(0.0, min(until - time.monotonic(), 0.2)))
            except Exception:  # queue.Empty: nothing more yet
                if not self.alive():
                    raise RuntimeError("the kernel died while running the learner's function") from None
                if time.monotonic() >= until:
                    return False
                continue
            if msg.get("parent_header", {}).get("msg_id") != self.session_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                print(content.get("text", ""), end="", file=sys.stderr if content.get("name") == "stderr" else sys.stdout)
            elif kind == "error":
                raise RuntimeError(f"the grader's call failed in the kernel: {content.get('ename')}: "
                                   f"{content.get('evalue')} (was the grader's helper in the kernel replaced?)")
            elif kind == "status" and content.get("execution_state") == "idle":
                return True

    def _check_time(self) -> None:
        if time.monotonic() > self.deadline:
            self._interrupt()
            raise TimeoutError("the learner's function ran past the cell's time limit")
        if not self.alive():
            raise RuntimeError("the kernel died while running the learner's function")

    def _interrupt(self) -> None:
        """Stop what the kernel runs (ipykernel raises KeyboardInterrupt in it) and close the session."""
        self.client.control_channel.send(self.client.session.msg("interrupt_request", {}))
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _exchange(self, message: dict) -> Any:
        """Send one request to the kernel's session and answer its callbacks until its answer comes."""
        conn = self._session()
        try:
            channel.send(conn, json.dumps(message))
            while True:
                conn.settimeout(0.2)
                try:
                    reply = channel.receive(conn)
                except TimeoutError:
                    self._check_time()
                    continue
                if reply is None:
                    raise self._lost("it closed the connection without an answer")
                if isinstance(reply, dict) and "callback" in reply:
                    conn.settimeout(None)
                    channel.send(conn, self._callback(reply["callback"]))
                    continue
                if not isinstance(reply, dict) or "answer" not in reply:
                    raise channel.ChannelError("a malformed answer (was the grader's helper in the kernel replaced?)")
                return reply["answer"]
        except (OSError, channel.ChannelError) as err:
            if self.conn is not None:
                self._interrupt()
            if isinstance(err, channel.ChannelError):
                raise
            raise self._lost(str(err)) from None

    def _lost(self, detail: str) -> RuntimeError:
        """Why the session's connection went: the kernel died (an exit or a crash in the learner's code), or something
        in the kernel closed it (the grader's helper replaced: evidence for review)."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        for _ in range(20):  # a kernel that exits closes the connection a moment before it is seen gone
            if not self.alive():
                return RuntimeError("the kernel died while running the learner's function")
            time.sleep(0.05)
        return RuntimeError(f"the kernel gave no answer: {detail} (was the grader's helper in the kernel replaced?)")

    def _callback(self, message: Any) -> bytes | str:
        """Run one operation on a handed-over object, here, on data the kernel sent; its outcome as data."""
        try:
            if not isinstance(message, dict) or message.get("op") not in CALLBACK_OPS:
                raise channel.ChannelError("a malformed callback")
            target = self.handles.get(message.get("h"))
            if target is None:
                raise channel.ChannelError(f"unknown handle {message.get('h')!r}")
            call = channel.Decoder(self.shared, handles=self.handles, originals=self.sent,
                                   refused_functions=self.refused)(message["call"])
            args, kwargs, name = call["args"], call["kwargs"], str(message.get("name", ""))
            torch.set_rng_state(call["rng"])
            random.setstate(call["py_random"])
            grad = bool(call.get("grad", True))
        except Exception as err:  # a malformed or forged message: the learner's call fails, nothing runs here
            return channel.dumps({"raised": {"type": "RuntimeError", "message": f"the grader refused a callback: {err}"}})
        outcome: dict[str, Any] = {}
        try:
            with torch.set_grad_enabled(grad):  # the learner's code may run under no_grad: so does the callback
                outcome["result"] = _operate(target, message["op"], name, args, kwargs)
        except Exception as err:  # raised in the kernel as the same kind of error
            outcome["raised"] = {"type": type(err).__name__, "message": str(err)[:4000]}
        outcome.update(args=args, kwargs=kwargs, rng=torch.get_rng_state(), py_random=random.getstate())
        encoder = channel.Encoder({id(v): k for k, v in self.shared.items()}, handle=self._handle,
                                  origins={id(v): n for n, v in self.sent.items()})
        try:
            return json.dumps(encoder(outcome), allow_nan=False).encode()
        except (channel.ChannelError, ValueError) as err:
            return channel.dumps({"raised": {"type": "TypeError", "message": f"the grader cannot send back: {err}"}})

    def describe(self, names: list[str]) -> dict[str, Any]:
        """The learner's names as seen here: proxies for functions and kernels, copies of values, none for missing."""
        info = self._exchange({"op": "describe", "names": names, "shared": list(self.shared)})
        out = {}
        for name in names:
            item = info.get(name) if isinstance(info, dict) else None
            if not isinstance(item, dict) or item.get("kind") not in ("function", "kernel", "value"):
                continue
            if item["kind"] == "value":
                if name in self.refused and not _plain_data(item["value"]):  # an answer is a function, or data
                    self.forged.add(name)
                    out[name] = channel.Opaque("value", f"{name} is not a function the learner defined")
                    continue
                try:
                    out[name] = channel.Decoder(self.shared, functions=False)(item["value"])
                except channel.ChannelError as err:
                    out[name] = channel.Opaque("value", str(err))
            else:
                out[name] = Remote(self, name, item)
        return out

    def call(self, name: str, grid: Any, args: tuple, kwargs: dict) -> Any:
        """Run the learner's ``name`` on these arguments in the kernel; its result, or its exception raised here."""
        with instruments.paused():  # the grader's own torch calls around the learner's are not the learner's
            return self._call(name, grid, args, kwargs)

    def _call(self, name: str, grid: Any, args: tuple, kwargs: dict) -> Any:
        shared_ids = {id(v): k for k, v in self.shared.items()}
        call = {"target": [name, grid], "args": list(args), "kwargs": dict(kwargs), "rng": torch.get_rng_state(),
                "py_random": random.getstate(), "grad": torch.is_grad_enabled(),
                "instruments": [[n, params] for n, params, _ in instruments.ACTIVE]}
        encoder = channel.Encoder(shared_ids, handle=self._handle)
        try:
            encoded = encoder(call)
        except channel.ChannelError as err:
            raise TypeError(f"the grader could not send the arguments of {name} into the sandbox: {err}") from None
        self.sent = encoder.objects  # what this call sent, by number: it comes back as itself, changed in place
        answer = self._exchange({"op": "serve", "shared": list(self.shared), "call": encoded})
        try:
            outcome = channel.Decoder(self.shared, handles=self.handles, originals=self.sent,
                                      refused_functions=self.refused)(answer)
        except channel.ChannelError as err:
            raise TypeError(f"{name} returned something the grader cannot read: {err}") from None
        if not isinstance(outcome, dict) or not {"args", "kwargs", "rng", "measured"} <= set(outcome):
            raise TypeError(f"{name}: the kernel's answer is malformed")
        seen: dict[int, Any] = {}
        for old, new in zip(args, outcome["args"]):
            channel.update_in_place(old, new, seen)
        for key, old in kwargs.items():
            if key in outcome["kwargs"]:
                channel.update_in_place(old, outcome["kwargs"][key], seen)
        with contextlib.suppress(Exception):  # a forged state only changes the grader's next random inputs
            torch.set_rng_state(outcome["rng"])
            random.setstate(outcome["py_random"])
        for (_, _, results), measured in zip(instruments.ACTIVE, outcome["measured"] or []):
            if results is not None and isinstance(measured, dict):
                for key in results:
                    value = measured.get(key, 0)
                    results[key] += value if type(value) is int and value >= 0 else 0
        if "raised" in outcome:
            raised = outcome["raised"] if isinstance(outcome["raised"], dict) else {}
            err = _exception(raised)
            if raised.get("cause") == "NotImplementedError" and not isinstance(err, NotImplementedError):
                err.__cause__ = NotImplementedError()
            _raise_in(str(raised.get("where", "")), err)
        return channel.substitute(outcome.get("result"), seen)


def _defined_names(source: str) -> set[str]:
    """The top-level names a cell defines: functions, classes and the assignments of the course's cells."""
    tree = _parse(source)
    names: set[str] = set()
    for node in tree.body if tree else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        for sub in ast.walk(node) if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For,
                                                      ast.With)) else ():
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                names.add(sub.id)
    return names


def _bound_names(source: str) -> set[str]:
    """The names a cell binds at top level other than by importing, in any form: assignment targets of every kind
    (tuples, walrus, ``for``, ``with ... as``, ``except ... as``, ``match``, ``del``), definitions, and ``global``
    inside a function. Names local to a function or a comprehension are not bound at top level; an import of a name
    the grader has too is how a learner reaches it, not a shadow."""
    tree = _parse(source)
    names: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if top:
                names.add(node.name)
            for child in ast.walk(node):  # `global x` in a body binds the cell's x
                if isinstance(child, ast.Global):
                    names.update(child.names)
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            top = False  # their own scope (a walrus inside still binds outside: below)
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif top and isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif top and isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif top and isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        for child in ast.iter_child_nodes(node):
            visit(child, top)

    if tree is not None:
        visit(tree, True)
    return names


#: Logged (and read by cohort grading) when a submission binds a name the tests take from the grader.
SHADOWED = "rebinds names the tests take from the grader, not from it"
FORGED = "sent, for an answer the tests call, something that is not a function it defined"


def _used_names(source: str) -> set[str]:
    tree = _parse(source)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} if tree else set()


def _python(source: str) -> str:
    """A cell without IPython's magics and shell lines (the course's test and setup cells use none that matter)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _parse(source: str) -> ast.Module | None:
    return parse_cell(_python(source))


def _meta(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


class TrustedExecute(Execute):
    """nbgrader's Execute, with the kernel in a sandbox and every graded test cell judged in this process."""

    def preprocess(self, nb: NotebookNode, resources: dict, km: Any = None) -> tuple[NotebookNode, dict]:
        conf = settings()
        if conf.get("salt"):  # the run's secret, from a file only this grader can read: never on a command line
            os.environ[SALT_VARIABLE] = conf["salt"]
        self.kernel_manager_class = SandboxedKernelManager
        self.own = Path(conf["own"])
        (self.own / "work").mkdir(exist_ok=True)
        resources.setdefault("metadata", {})["path"] = str(self.own / "work")
        self.extra_arguments = [*self.extra_arguments, "--HistoryManager.hist_file=:memory:"]
        self.assignment = conf["assignment"]
        self._grader: Grader | None = None
        self._trusted_ns: dict[str, Any] | None = None
        self._learner_names: set[str] = set()
        self._bound: set[str] = set()  # what the submission's answer cells bind
        self._forged: set[str] = set()  # answers the kernel described as something other than its function
        nb, resources = super().preprocess(nb, resources, km)
        shadowed = sorted(self._bound & (set(self._trusted_ns or ()) | set(dir(builtins))) - self._learner_names)
        if shadowed:
            self.log.warning("%s: %s", SHADOWED, ", ".join(shadowed)[:500])
        forged = sorted(self._forged | (self._grader.forged if self._grader is not None else set()))
        if forged:
            self.log.warning("%s: %s", FORGED, ", ".join(forged)[:500])
        return nb, resources

    def create_kernel_manager(self) -> AsyncKernelManager:
        km = super().create_kernel_manager()
        km.transport = "ipc"
        km.ip = str(self.own / "kernel")
        km.connection_file = str(self.own / "kernel.json")
        return km

    async def async_execute_cell(self, cell: NotebookNode, cell_index: int, execution_count: int | None = None,
                                 store_history: bool = True) -> NotebookNode:
        if cell.cell_type != "code":
            return cell
        if self._grader is None:
            await self._start_grader()
        meta = _meta(cell)
        if meta.get("grade") and not meta.get("solution"):
            return self._judge(cell)
        if meta.get("solution"):  # the tests take from it only the exercise's names (the instructor's answers)
            self._bound |= _bound_names(cell.source)
        return await super().async_execute_cell(cell, cell_index, execution_count, store_history)

    async def _start_grader(self) -> None:
        helper = {"cell_type": "code", "source": "from specdec.course import kernel_side as __specdec_grader__",
                  "metadata": {}, "outputs": [], "execution_count": None}
        last = self.nb.cells[-1] if self.nb.cells else None
        await super().async_execute_cell(nbformat.from_dict(helper), -1, store_history=False)
        if last is not None:  # nbclient stores the cell it ran at the index it was given: the notebook's last
            self.nb.cells[-1] = last
        def alive() -> bool:
            process = getattr(getattr(self.km, "provisioner", None), "process", None)
            return process is not None and process.poll() is None

        self._grader = Grader(self.km.get_connection_info(), self.own, float(self.timeout or 120), alive)
        conf = settings()

        def untrusted_command(cmd: list[str], env: dict[str, str]) -> list[str]:
            # a fresh folder in the grader's private /tmp each time: never one inside the kernel's folder, where the
            # kernel could have left a link to the grader's own files in its place
            return sandbox.command(Path(tempfile.mkdtemp(prefix="untrusted-")), Path(conf["build"]), cmd,
                                   sandbox.Limits(**conf["limits"]), env)

        instruments.untrusted_command = untrusted_command

    def _trusted_namespace(self) -> dict[str, Any]:
        """The course's locked cells (from the instructor notebook) that need nothing of the learner, run here."""
        if self._trusted_ns is None:
            course = nbformat.read(source_notebook(self.assignment), as_version=4)
            answers = set().union(*(_defined_names(c.source) for c in course.cells
                                    if c.cell_type == "code" and _meta(c).get("solution")))
            self._learner_names |= answers
            ns: dict[str, Any] = {"__name__": "__main__"}
            for c in course.cells:
                meta = _meta(c)
                if c.cell_type != "code" or meta.get("solution") or meta.get("grade") or not meta.get("locked"):
                    continue
                if _used_names(c.source) & answers:
                    continue  # a demonstration of the learner's code
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    try:
                        exec(compile(_python(c.source), f"<course cell {meta.get('grade_id', '')}>", "exec"), ns)
                    except Exception:  # a course cell that fails here fails the tests that need it, visibly
                        pass
            self._trusted_ns = ns
            assert self._grader is not None
            self._grader.refused = frozenset(self._learner_names)
            self._grader.shared = {k: v for k, v in ns.items() if isinstance(v, torch.nn.Module)}
        return self._trusted_ns

    def _judge(self, cell: NotebookNode) -> NotebookNode:
        """Run a graded test cell here, against proxies of the learner's names; its outputs are what nbgrader scores."""
        assert self._grader is not None
        ns = dict(self._trusted_namespace())
        wanted = sorted((_used_names(cell.source) - set(ns) - set(dir(builtins))) | self._learner_names)
        cell.outputs = []
        self._grader.forget_handles()
        out, err = io.StringIO(), io.StringIO()
        self._grader.deadline = time.monotonic() + float(self.timeout or 120)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    ns.update(self._grader.describe(wanted))
                    exec(compile(_python(cell.source), "<test cell>", "exec"), ns)
                finally:
                    self._grader.end_session()
        except Exception as exc:  # the verdict: an error output scores the cell 0
            error = exc
        else:
            error = None
        if out.getvalue():
            cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=out.getvalue()))
        if err.getvalue():
            cell.outputs.append(nbformat.v4.new_output("stream", name="stderr", text=err.getvalue()))
        if error is not None:
            exercise = str(cell.metadata.get("nbgrader", {}).get("grade_id", "")).removesuffix("_test")
            cell.outputs.append(nbformat.v4.new_output("error", ename=type(error).__name__, evalue=str(error),
                                                       traceback=learner_traceback(error, exercise)))
        return cell

    async def _async_cleanup_kernel(self) -> None:
        if getattr(self, "_grader", None) is not None:
            self._forged |= self._grader.forged
            self._grader.close()
            self._grader = None
        await super()._async_cleanup_kernel()

    execute_cell = run_sync(async_execute_cell)  # nbclient binds its own coroutine here: bind this class's
    _cleanup_kernel = run_sync(_async_cleanup_kernel)
