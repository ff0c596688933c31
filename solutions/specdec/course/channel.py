"""Values across the sandbox wall: what the grader sends a learner's function and what comes back.

Cohort grading calls a learner's function in a kernel it does not trust (``specdec.course.trusted``). Arguments go in
and results come out as JSON built here, never as pickle: decoding runs no code a message names, and builds only

- exact ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str`` and ``bytes`` (an ``int`` subclass whose ``!=`` lies
  cannot come back: it arrives as an opaque value that equals nothing);
- ``list``, ``tuple``, ``dict``, ``set``, ``frozenset`` and ``slice``;
- tensors (dtype, size, stride and storage offset kept, so a non-contiguous or guarded view stays one), numpy
  arrays and scalars of numeric dtypes, ``torch.dtype``, ``torch.device``, ``torch.Size`` and generators (their state);
- instances of classes defined in ``specdec`` or ``torch.nn`` (their attributes set with ``object.__setattr__``;
  no ``__init__``, ``__new__`` or ``__setstate__`` of theirs runs), enum members, and functions or classes of those
  packages by name;
- shared objects by key (``ref``): the models both sides loaded, so an 18 MB target is not copied at every call;
- handles (``h``), from the grader only: what a check hands the learner's function that cannot cross as data (a model
  of its own, a counting wrapper, a drafter defined in a check, a closure). The kernel gets a :class:`Callback` proxy;
  calling it, or reading an attribute of it, asks the grader (``specdec.course.trusted``), which runs the real object
  in its own process and sends back the result as data. So what a check counts or records is counted outside the
  sandbox, and the checks' code never enters it.

Anything else is encoded as :class:`Opaque`. Each mutable value carries an id, so an object that appears twice (an
argument the function returns, a tensor a context watches) is one object after decoding.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import importlib
import json
import re
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

MAX_BYTES = 512 * 2**20  # one message, encoded
MAX_DEPTH = 64

_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_NUMERIC_NP = set("biufc")  # numpy kinds: bool, int, uint, float, complex (never object or void)
_PACKAGES = re.compile(r"^(specdec|torch\.nn)(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: Modules the sandbox does not have (``specdec.course.sandbox.WITHHELD``) or must not build from a message.
_TRUSTED_ONLY = re.compile(r"^specdec\.(checks|mistakes|course)(\.|$)")
PUBLIC_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


class ChannelError(ValueError):
    """A message that cannot be encoded or decoded; the text names the value and why."""


@dataclasses.dataclass(frozen=True)
class Opaque:
    """A value the other side could not send as data (an object of a class the learner defined, a lambda, a file)."""

    type_name: str
    text: str

    def __repr__(self) -> str:
        return f"<an object of type {self.type_name} that the grader cannot read: {self.text}>"

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ChannelError("bytes must be base64 text")
    return base64.b64decode(text.encode("ascii"), validate=True)


def _qualified(obj: Any) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _storage_bytes(t: torch.Tensor) -> bytes:
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy().tobytes() if storage.nbytes() else b""


class Encoder:
    """Turns a value into JSON-ready data. ``shared`` maps id(object) -> key for objects sent by reference."""

    def __init__(self, shared: Mapping[int, str] | None = None, handle: Callable[[Any], dict] | None = None,
                 origins: Mapping[int, int] | None = None):
        self.shared = dict(shared or {})
        self.handle = handle  # the grader's: value -> {"h": key, ...} for what cannot cross as data
        self.origins = dict(origins or {})  # id(object) -> its number in the message that brought it here
        self.objects: dict[int, Any] = {}  # number -> the object encoded under it
        self.ids: dict[int, int] = {}
        self.keep: list[Any] = []  # keeps encoded objects alive, so no id is reused while encoding

    def __call__(self, value: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ChannelError(f"nested more than {MAX_DEPTH} levels deep")
        kind = type(value)
        if value is None or kind in (bool, str, int):
            return value  # JSON keeps an int exact, of any size
        if kind is float:
            return {"f": repr(value)}
        if kind is complex:
            return {"c": [repr(value.real), repr(value.imag)]}
        if kind is bytes:
            return {"b": _b64(value)}
        if id(value) in self.shared:
            return {"ref": self.shared[id(value)]}
        if id(value) in self.ids:
            return {"@": self.ids[id(value)]}
        if kind is Callback:
            return {"h": value._key}
        if self.handle is not None and needs_handle(value):
            return self.handle(value)
        if kind in (torch.dtype, torch.device, torch.Size, slice, range) or isinstance(value, (np.generic, enum.Enum)):
            return self._atom(value, depth)
        if isinstance(value, (types.FunctionType, type)) and _PACKAGES.match(getattr(value, "__module__", "") or ""):
            return {"fn": _qualified(value)}
        if kind is tuple and all(type(v) is int for v in value):  # a generator's state: 625 ints, sent as they are
            return {"ti": list(value)}
        if self.handle is not None and not _is_data(value):
            return self.handle(value)
        number = self.ids[id(value)] = len(self.ids)
        self.keep.append(value)
        self.objects[number] = value
        data = self._numbered(value, kind, number, depth)
        if id(value) in self.origins:  # an object the other side sent in this call: it gets its own back
            data["orig"] = self.origins[id(value)]
        return data

    def _numbered(self, value: Any, kind: type, number: int, depth: int) -> dict:
        if kind in (list, tuple, set, frozenset):
            tag = {list: "l", tuple: "t", set: "s", frozenset: "fs"}[kind]
            return {tag: [self(v, depth + 1) for v in value], "id": number}
        if kind is dict:
            return {"d": [[self(k, depth + 1), self(v, depth + 1)] for k, v in value.items()], "id": number}
        if isinstance(value, torch.Tensor) and kind in (torch.Tensor, torch.nn.Parameter):
            return {"T": self._tensor(value), "P": kind is torch.nn.Parameter, "id": number}
        if kind is np.ndarray and value.dtype.kind in _NUMERIC_NP:
            return {"N": value.dtype.str, "shape": list(value.shape), "data": _b64(np.ascontiguousarray(value).tobytes()),
                    "id": number}
        if kind is torch.Generator:
            return {"G": str(value.device), "state": self._tensor(value.get_state()), "id": number}
        if _PACKAGES.match(kind.__module__ or "") and not isinstance(value, BaseException):
            return self._object(value, number, depth)
        return {"x": f"{kind.__module__}.{kind.__qualname__}", "repr": _short_repr(value), "id": number}

    def _atom(self, value: Any, depth: int) -> Any:
        if isinstance(value, torch.dtype):
            return {"dt": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"dev": str(value)}
        if isinstance(value, torch.Size):
            return {"sz": [int(v) for v in value]}
        if isinstance(value, slice):
            return {"sl": [self(value.start, depth + 1), self(value.stop, depth + 1), self(value.step, depth + 1)]}
        if isinstance(value, range):
            return {"rg": [value.start, value.stop, value.step]}
        if isinstance(value, enum.Enum):
            if _PACKAGES.match(type(value).__module__ or ""):
                return {"E": _qualified(type(value)), "name": value.name}
            return {"x": type(value).__qualname__, "repr": _short_repr(value)}
        if value.dtype.kind in _NUMERIC_NP:
            return {"ns": value.dtype.str, "data": _b64(value.tobytes())}
        return {"x": type(value).__qualname__, "repr": _short_repr(value)}

    def _tensor(self, t: torch.Tensor) -> dict:
        name = str(t.dtype).removeprefix("torch.")
        meta = {"dtype": name, "size": list(t.shape), "stride": list(t.stride()), "offset": t.storage_offset(),
                "device": str(t.device), "grad": bool(t.requires_grad and t.is_leaf)}
        if t.device.type == "meta":
            return meta
        cpu = t.detach() if t.device.type == "cpu" else t.detach().cpu()
        return {**meta, "data": _b64(_storage_bytes(cpu)), "nbytes": cpu.untyped_storage().nbytes()}

    def _object(self, value: Any, number: int, depth: int) -> dict:
        if isinstance(value, tuple) and hasattr(type(value), "_fields"):  # a namedtuple
            return {"o": _qualified(type(value)), "nt": [self(v, depth + 1) for v in value], "id": number}
        state = dict(vars(value)) if hasattr(value, "__dict__") else {}
        for name in getattr(type(value), "__slots__", ()):
            if hasattr(value, name):
                state[name] = getattr(value, name)
        return {"o": _qualified(type(value)), "state": [[k, self(v, depth + 1)] for k, v in state.items()],
                "id": number}


def _is_data(value: Any) -> bool:
    """True for what the Encoder sends as data (containers, tensors, arrays, generators, the package's objects)."""
    kind = type(value)
    return (kind in (list, tuple, set, frozenset, dict, torch.Tensor, torch.nn.Parameter, torch.Generator)
            or (kind is np.ndarray and value.dtype.kind in _NUMERIC_NP)
            or (bool(_PACKAGES.match(kind.__module__ or "")) and not isinstance(value, BaseException))
            or not callable(value))


def needs_handle(value: Any) -> bool:
    """True for what the grader hands over by handle: a module not shared by key, an object or function of a module the
    sandbox does not have, and a function the sandbox cannot find by name (a lambda, a closure)."""
    if isinstance(value, torch.nn.Module):
        return True
    if isinstance(value, (types.FunctionType, type)):
        module = getattr(value, "__module__", "") or ""
        return not _PACKAGES.match(module) or bool(_TRUSTED_ONLY.match(module)) or "<" in value.__qualname__
    if isinstance(value, (types.MethodType, types.BuiltinFunctionType)) or type(value).__name__ == "partial":
        return True
    return bool(_TRUSTED_ONLY.match(type(value).__module__ or "")) and not isinstance(value, BaseException)


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a learner's __repr__ may raise
        text = "(its repr raised)"
    return text[:200]


_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*|_[A-Za-z0-9][A-Za-z0-9_]*")  # no dunder: no __main__, __class__


def _resolve(qualified: Any, want_class: bool, may_import: bool = False) -> Any:
    """A class or function of specdec or torch.nn by 'module:qualname': only an object *defined* there under exactly
    that name (its ``__module__`` and ``__qualname__``), found through the module's own namespace and its classes',
    never through an attribute that is another module (``specdec.paths:os.popen`` is refused). Only modules already
    imported on this side, unless ``may_import`` (the kernel decoding the grader's messages): a name a submission
    sends never makes the grader import anything (``specdec.bench.__main__`` would run a benchmark)."""
    if not isinstance(qualified, str) or ":" not in qualified:
        raise ChannelError(f"bad name {qualified!r}")
    module, name = qualified.split(":", 1)
    parts = name.split(".")
    if (not _PACKAGES.match(module) or _TRUSTED_ONLY.match(module)
            or not all(_IDENTIFIER.fullmatch(p) for p in module.split(".") + parts)):
        raise ChannelError(f"{qualified!r} is not a class or function of the course's package")
    if module not in sys.modules and not may_import:
        raise ChannelError(f"{qualified!r}: its module is not loaded on the grader's side")
    obj: Any = sys.modules.get(module) or importlib.import_module(module)
    for depth, part in enumerate(parts):
        if depth and not isinstance(obj, type):
            raise ChannelError(f"{qualified!r} is not a class or function of the course's package")
        obj = vars(obj).get(part)
    if (not isinstance(obj, (type, types.FunctionType)) or getattr(obj, "__module__", None) != module
            or getattr(obj, "__qualname__", None) != name):
        raise ChannelError(f"{qualified!r} is not a class or function defined in {module}")
    if want_class and not isinstance(obj, type):
        raise ChannelError(f"{qualified!r} is not a class")
    return obj


class Decoder:
    """Builds values from Encoder's data. ``shared`` maps key -> the local object sent by reference."""

    def __init__(self, shared: Mapping[str, Any] | None = None, handles: Mapping[str, Any] | None = None,
                 callbacks: Callable[[dict], Callback] | None = None, originals: Mapping[int, Any] | None = None,
                 trusted_sender: bool = False, refused_functions: frozenset[str] = frozenset(),
                 functions: bool = True):
        """``trusted_sender``: the messages come from the grader (the kernel's decoder). Otherwise (the grader's, by
        default) they come from a kernel that may be hostile: names resolve only to what its modules define and
        have loaded, and objects are rebuilt only as plain data (see ``_object``)."""
        self.trusted_sender = trusted_sender
        self.refused_functions = refused_functions  # the graded exercises: a kernel never names their references
        self.functions = functions  # False: no function crosses by name at all (what a kernel says a name holds)
        self.shared = dict(shared or {})
        self.originals = originals or {}  # number -> what this side sent under it (an "orig" comes back as it)
        self.handles = handles  # the grader's: key -> the object it handed over
        self.callbacks = callbacks  # the kernel's: handle data -> its proxy
        self.objects: dict[int, Any] = {}

    def __call__(self, data: Any, depth: int = 0) -> Any:
        out = self._decode(data, depth)
        if type(data) is dict and "orig" in data:  # this side's own object, as the other side left it
            original = self.originals.get(data["orig"]) if type(data["orig"]) is int else None
            if original is not None and original is not out and update_in_place(original, out) is original:
                self.objects[data.get("id")] = original
                return original
        return out

    def _decode(self, data: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ChannelError(f"nested more than {MAX_DEPTH} levels deep")
        if data is None or type(data) in (bool, str, int):
            return data
        if type(data) is not dict or not data:
            raise ChannelError(f"unexpected {type(data).__name__} in a message")
        tag = next(iter(data))
        if tag == "f":
            return float(data["f"])
        if tag == "c":
            return complex(float(data["c"][0]), float(data["c"][1]))
        if tag == "b":
            return _unb64(data["b"])
        if tag == "ref":
            if data["ref"] not in self.shared:
                raise ChannelError(f"unknown shared object {data['ref']!r}")
            return self.shared[data["ref"]]
        if tag == "h":
            if self.handles is not None and data["h"] in self.handles:
                return self.handles[data["h"]]
            if self.callbacks is not None:
                return self.callbacks(data)
            raise ChannelError(f"unknown handle {data['h']!r}")
        if tag == "@":
            if data["@"] not in self.objects:
                raise ChannelError("a reference to an object not yet sent")
            return self.objects[data["@"]]
        simple = self._atom(tag, data, depth)
        if simple is not _NONE:
            return simple
        number = data.get("id")
        if tag in ("l", "t", "s", "fs"):
            if tag == "l":
                out: Any = []
                self.objects[number] = out
                out.extend(self(v, depth + 1) for v in data["l"])
                return out
            items = [self(v, depth + 1) for v in data[tag]]
            out = {"t": tuple, "s": set, "fs": frozenset}[tag](items)
        elif tag == "d":
            out = {}
            self.objects[number] = out
            for k, v in data["d"]:
                out[self(k, depth + 1)] = self(v, depth + 1)
            return out
        elif tag == "T":
            out = self._tensor(data["T"])
            if data.get("P"):
                out = torch.nn.Parameter(out, requires_grad=data["T"]["grad"])
        elif tag == "N":
            dtype = np.dtype(data["N"])
            if dtype.kind not in _NUMERIC_NP:
                raise ChannelError(f"numpy dtype {dtype} is not numeric")
            out = np.frombuffer(_unb64(data["data"]), dtype=dtype).copy().reshape([int(s) for s in data["shape"]])
        elif tag == "G":
            out = torch.Generator(device=data["G"])
            out.set_state(self._tensor(data["state"]))
        elif tag == "o":
            out = self._object(data, number, depth)
        elif tag == "x":
            out = Opaque(str(data["x"])[:200], str(data.get("repr", ""))[:200])
        else:
            raise ChannelError(f"unknown tag {tag!r}")
        self.objects[number] = out
        return out

    def _atom(self, tag: str, data: dict, depth: int) -> Any:
        if tag == "dt":
            if data["dt"] not in _DTYPES:
                raise ChannelError(f"unknown dtype {data['dt']!r}")
            return _DTYPES[data["dt"]]
        if tag == "dev":
            return torch.device(str(data["dev"]))
        if tag == "sz":
            return torch.Size([int(v) for v in data["sz"]])
        if tag == "sl":
            return slice(*(self(v, depth + 1) for v in data["sl"]))
        if tag == "rg":
            return range(*(int(v) for v in data["rg"]))
        if tag == "ti":
            if type(data["ti"]) is not list or not all(type(v) is int for v in data["ti"]):
                raise ChannelError("a tuple of ints that holds something else")
            return tuple(data["ti"])
        if tag == "E":
            cls = _resolve(data["E"], want_class=True, may_import=self.trusted_sender)
            if not issubclass(cls, enum.Enum):
                raise ChannelError(f"{data['E']} is not an enum")
            return cls[data["name"]]
        if tag == "ns":
            dtype = np.dtype(data["ns"])
            if dtype.kind not in _NUMERIC_NP:
                raise ChannelError(f"numpy dtype {dtype} is not numeric")
            return np.frombuffer(_unb64(data["data"]), dtype=dtype)[0]
        if tag == "fn":
            if not self.functions:
                raise ChannelError("a function by name where the grader reads a value")
            found = _resolve(data["fn"], want_class=False, may_import=self.trusted_sender)
            if getattr(found, "__name__", None) in self.refused_functions:
                raise ChannelError(f"{data['fn']!r} is the reference of an exercise being graded")
            return found
        return _NONE

    def _tensor(self, meta: dict) -> torch.Tensor:
        if meta["dtype"] not in _DTYPES:
            raise ChannelError(f"unknown dtype {meta['dtype']!r}")
        dtype = _DTYPES[meta["dtype"]]
        size, stride = [int(v) for v in meta["size"]], [int(v) for v in meta["stride"]]
        if meta["device"] == "meta":
            return torch.empty_strided(size, stride, dtype=dtype, device="meta")
        raw = bytearray(_unb64(meta["data"]))
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        storage = flat.untyped_storage()
        try:
            t = torch.empty(0, dtype=dtype).set_(storage, int(meta["offset"]), size, stride)
        except RuntimeError as err:
            raise ChannelError(f"a tensor that does not fit its storage: {err}") from None
        if meta["device"] != "cpu":
            t = t.to(meta["device"])
        return t.requires_grad_(bool(meta["grad"])) if dtype.is_floating_point else t

    def _object(self, data: dict, number: int, depth: int) -> Any:
        cls = _resolve(data["o"], want_class=True, may_import=self.trusted_sender)
        if issubclass(cls, BaseException):
            raise ChannelError(f"{data['o']} is an exception class")
        if not self.trusted_sender and issubclass(cls, torch.nn.Module):
            raise ChannelError(f"{data['o']} is a module: models cross by reference or handle, never rebuilt")
        fields = ({f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else None)
        if "nt" in data:
            if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
                raise ChannelError(f"{data['o']} is not a namedtuple")
            return cls._make(self(v, depth + 1) for v in data["nt"])
        out = object.__new__(cls)
        self.objects[number] = out
        for name, value in data["state"]:
            if not isinstance(name, str):
                raise ChannelError("an attribute name that is not a string")
            if not self.trusted_sender and not _plain_attribute(cls, fields, name):
                raise ChannelError(f"{data['o']}: attribute {name[:60]!r} is not one of its data fields")
            object.__setattr__(out, name, self(value, depth + 1))
        return out


def _plain_attribute(cls: type, fields: set[str] | None, name: str) -> bool:
    """Whether an object rebuilt from a kernel's message may have attribute ``name``: a dataclass's declared fields
    only; for another class, an instance attribute that hides nothing of the class (no method, property or
    ``__class__`` replaced by what the kernel sent)."""
    if not _IDENTIFIER.fullmatch(name):
        return False
    return name in fields if fields is not None else not hasattr(cls, name)


_NONE = object()


class Callback:
    """In the kernel: an object the grader handed over by handle. Calls, items, lengths, truth and attributes go to the grader
    through ``ask(key, op, name, args, kwargs)``; a public method listed in the handle is called in one exchange."""

    def __init__(self, key: str, name: str, methods: frozenset[str], ask: Callable[..., Any]):
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_ask", ask)
        object.__setattr__(self, "_methods", methods)
        object.__setattr__(self, "__name__", name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._ask(self._key, "call", "", args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if not PUBLIC_NAME.fullmatch(name):
            raise AttributeError(name)
        if name in self._methods:
            return lambda *args, **kwargs: self._ask(self._key, "method", name, args, kwargs)
        return self._ask(self._key, "getattr", name, (), {})

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self.__name__} belongs to the grader: its attributes are read-only here")

    def __getitem__(self, item: Any) -> Any:
        return self._ask(self._key, "getitem", "", (item,), {})

    def __len__(self) -> int:
        return self._ask(self._key, "len", "", (), {})

    def __bool__(self) -> bool:  # what the object itself says (without this, Python would ask for a length)
        return self._ask(self._key, "bool", "", (), {})

    def __iter__(self) -> Any:
        return iter(self._ask(self._key, "iter", "", (), {}))

    def __repr__(self) -> str:
        return f"<{self.__name__}, the grader's>"

    def __deepcopy__(self, memo: dict) -> Callback:
        return self


def public_methods(value: Any) -> list[str]:
    """The names a :class:`Callback` for value calls as methods in one exchange: public functions of its class."""
    if isinstance(value, (types.FunctionType, types.MethodType, type, types.BuiltinFunctionType)):
        return []
    return sorted(name for name in dir(type(value)) if PUBLIC_NAME.fullmatch(name)
                  and isinstance(getattr(type(value), name, None), (types.FunctionType, staticmethod, classmethod)))


def send(conn: Any, payload: str | bytes) -> None:
    """One message on a stream socket: its length in 8 bytes, then the bytes."""
    data = payload.encode() if isinstance(payload, str) else payload
    conn.sendall(len(data).to_bytes(8, "big") + data)


def receive(conn: Any) -> Any:
    """The next message on a stream socket, parsed as JSON (not decoded); None when the other side closed it."""
    head = _read_exactly(conn, 8)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > MAX_BYTES:
        raise ChannelError(f"a message of {size:,} bytes, more than the {MAX_BYTES:,} allowed")
    body = _read_exactly(conn, size)
    if body is None:
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as err:  # not JSON, or an int of more digits than Python reads
        raise ChannelError(f"not a message: {err}") from None


def _read_exactly(conn: Any, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def dumps(value: Any, shared: Mapping[int, str] | None = None) -> str:
    return json.dumps(Encoder(shared)(value), allow_nan=False)


def loads(text: str | bytes, shared: Mapping[str, Any] | None = None) -> Any:
    if len(text) > MAX_BYTES:
        raise ChannelError(f"a message of {len(text):,} bytes, more than the {MAX_BYTES:,} allowed")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ChannelError(f"not a message: {err}") from None
    try:
        return Decoder(shared)(data)
    except ChannelError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError, RecursionError) as err:
        raise ChannelError(f"a malformed message ({type(err).__name__}: {err})") from None


def update_in_place(old: Any, new: Any, seen: dict[int, Any] | None = None) -> Any:
    """Make ``old`` hold what ``new`` holds, keeping ``old``'s identity where it is mutable (the function changed its
    argument in the sandbox; the caller holds the original). Returns the object the caller should now use."""
    seen = {} if seen is None else seen
    if id(new) in seen:
        return seen[id(new)]
    if old is new:
        return old
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        same = (old.dtype == new.dtype and old.device == new.device and old.device.type != "meta"
                and old.shape == new.shape and old.stride() == new.stride()
                and old.storage_offset() == new.storage_offset()
                and old.untyped_storage().nbytes() == new.untyped_storage().nbytes())
        if not same:
            return new
        with torch.no_grad():
            old.untyped_storage().copy_(new.untyped_storage())
        seen[id(new)] = old
        return old
    if type(old) is list and type(new) is list:
        seen[id(new)] = old
        merged = [update_in_place(o, n, seen) for o, n in zip(old, new)] + new[len(old):]
        old[:] = merged
        return old
    if type(old) is dict and type(new) is dict:
        seen[id(new)] = old
        merged = {k: update_in_place(old[k], v, seen) if k in old else v for k, v in new.items()}
        old.clear()
        old.update(merged)
        return old
    if type(old) is set and type(new) is set:
        old.clear()
        old.update(new)
        return old
    if type(old) is torch.Generator and type(new) is torch.Generator:
        old.set_state(new.get_state())
        return old
    if type(old) is type(new) and _PACKAGES.match(type(old).__module__ or "") and hasattr(old, "__dict__") \
            and not isinstance(old, (tuple, enum.Enum)) and not _frozen(old):
        seen[id(new)] = old
        for name, value in vars(new).items():
            current = vars(old).get(name, _NONE)
            object.__setattr__(old, name, value if current is _NONE else update_in_place(current, value, seen))
        for name in set(vars(old)) - set(vars(new)):
            object.__delattr__(old, name)
        return old
    return new


def _frozen(value: Any) -> bool:
    """A frozen dataclass: never changed in place (a learner's copy cannot rewrite the grader's constants)."""
    params = getattr(type(value), "__dataclass_params__", None)
    return bool(params is not None and params.frozen)


def substitute(value: Any, seen: Mapping[int, Any], depth: int = 0) -> Any:
    """``value`` with every object that ``update_in_place`` mapped to an original replaced by that original."""
    if id(value) in seen:
        return seen[id(value)]
    if depth > MAX_DEPTH:
        return value
    if type(value) is list:
        value[:] = [substitute(v, seen, depth + 1) for v in value]
    elif type(value) is tuple:
        return tuple(substitute(v, seen, depth + 1) for v in value)
    elif type(value) is dict:  # keys too: a dict keyed by the requests passed in stays keyed by them
        items = [(substitute(k, seen, depth + 1), substitute(v, seen, depth + 1)) for k, v in value.items()]
        value.clear()
        value.update(items)
    elif type(value) in (set, frozenset):
        return type(value)(substitute(v, seen, depth + 1) for v in value)
    elif isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return type(value)._make(substitute(v, seen, depth + 1) for v in value)
    elif hasattr(value, "__dict__") and _PACKAGES.match(type(value).__module__ or "") \
            and not isinstance(value, (enum.Enum, torch.nn.Module)):
        for name, v in list(vars(value).items()):
            object.__setattr__(value, name, substitute(v, seen, depth + 1))
    return value

