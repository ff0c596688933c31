"""The wall between the grader and a learner's sandboxed kernel (specdec.course.channel, specdec.course.trusted):
values cross as data, what cannot is handed over by handle and runs on the grader's side, and nothing a message
names is built unless it is plain data or a lesson's own class."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import torch

from specdec.checks.greedy import CountingLM
from specdec.course import channel
from specdec.course.trusted import _operate
from specdec.models.toy import ToyLM


def _round_trip(value, handle=None, callbacks=None):
    return channel.Decoder(callbacks=callbacks)(json.loads(json.dumps(channel.Encoder(handle=handle)(value))))


def test_data_crosses_with_its_shape_dtype_and_sharing():
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    view = base.t()[1:, ::2]  # non-contiguous, offset
    shared_list = [1, 2]
    value = {"view": view, "again": view, "ids": torch.tensor([3, 1], dtype=torch.int32), "np": np.arange(3.0),
             "lists": (shared_list, shared_list), "big": 2**70, "f": 0.1, "dtype": torch.float16, "none": None}
    got = _round_trip(value)
    assert torch.equal(got["view"], view) and got["view"].stride() == view.stride()
    assert got["view"].storage_offset() == view.storage_offset() and got["again"] is got["view"]
    assert got["ids"].dtype == torch.int32 and got["big"] == 2**70 and got["f"] == 0.1
    assert got["lists"][0] is got["lists"][1] and got["dtype"] is torch.float16 and np.array_equal(got["np"], np.arange(3.0))


def test_a_lying_int_arrives_as_an_opaque_value_that_equals_nothing():
    class Liar(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    got = _round_trip(Liar(0))
    assert isinstance(got, channel.Opaque) and got != 0 and got != got


def test_a_message_cannot_build_the_graders_own_classes_or_functions():
    for forged in ({"o": "specdec.checks.greedy:CountingLM", "state": [], "id": 0},
                   {"fn": "specdec.checks.core:expect_equal"}, {"fn": "specdec.course.cohort:main"},
                   {"o": "builtins:object", "state": [], "id": 0}, {"fn": "os:system"}):
        with pytest.raises(channel.ChannelError):
            channel.Decoder()(forged)
    with pytest.raises(channel.ChannelError, match="unknown handle"):
        channel.Decoder(handles={})({"h": "h0"})


def test_what_cannot_cross_is_handed_over_and_answered_by_its_owner():
    counting = CountingLM(ToyLM(7, seed=0))
    handed: dict[str, object] = {}

    def handle(value):
        handed[key := f"h{len(handed)}"] = value
        return {"h": key, "name": type(value).__name__, "methods": channel.public_methods(value)}

    asked = []

    def ask(key, op, name, args, kwargs):  # the grader's side of a callback, without the socket
        asked.append((op, name))
        return _operate(handed[key], op, name, list(args), kwargs)

    def proxy(data):
        return channel.Callback(data["h"], data["name"], frozenset(data["methods"]), ask)

    sent = _round_trip({"model": counting, "fn": lambda x: x + 1, "module": torch.nn.Linear(2, 2)}, handle, proxy)
    assert all(isinstance(v, channel.Callback) for v in sent.values())
    tokens = torch.tensor([1, 2, 3])
    assert torch.equal(sent["model"].logits(tokens), counting._model.logits(tokens))
    assert counting.calls == 1, "the call is counted by the grader's object, outside the sandbox"
    assert sent["model"].vocab_size == 7 and sent["fn"](4) == 5 and asked[0] == ("method", "logits")
    assert sent["fn"] and sent["module"], "a handed-over function or module is true, as the grader's object is"
    handed["empty"] = []
    assert not channel.Callback("empty", "list", frozenset(), ask), "an empty list handed over is false, as it is here"
    with pytest.raises(AttributeError):
        sent["model"].calls = 0
    with pytest.raises(AttributeError):
        sent["model"]._private  # noqa: B018 (a private attribute is never asked for)
    with pytest.raises(AttributeError, match="public"):
        _operate(counting, "getattr", "__class__", [], {})
    with pytest.raises(AttributeError, match="module"):
        _operate(type("WithModule", (), {"os": json})(), "getattr", "os", [], {})
    assert channel.Encoder()(counting)["o"].startswith("specdec.checks")  # without a handle: never from the kernel


def test_a_callback_reads_data_attributes_only_never_the_object_behind_a_wrapper():
    """Issue 51: a counting wrapper's model, read through a callback, came into the kernel as a copy that the learner's
    code could call uncounted (one target call per round, checked, while the copy did the work). A torch model read
    so goes back by handle (notebooks 12 and 14 read a model's embed_tokens): its calls are the grader's."""
    counting = CountingLM(ToyLM(7, seed=0))
    wrapper = type("Wrapper", (), {})()
    wrapper.model, wrapper.config, wrapper.shape = ToyLM(5, seed=1), {"vocab": 5, "dims": (2, 3)}, torch.Size([2])
    wrapper.layer, wrapper.weight = torch.nn.Linear(2, 2), torch.nn.Parameter(torch.zeros(2))
    for target, name in ((counting, "_model"), (wrapper, "model")):
        with pytest.raises(AttributeError):
            _operate(target, "getattr", name, [], {})
    assert _operate(wrapper, "getattr", "layer", [], {}) is wrapper.layer  # a model goes back by handle: counted here
    assert channel.needs_handle(wrapper.layer) and not channel.needs_handle(wrapper.model)
    assert _operate(wrapper, "getattr", "config", [], {}) == {"vocab": 5, "dims": (2, 3)}
    assert _operate(wrapper, "getattr", "shape", [], {}) == torch.Size([2])
    assert _operate(wrapper, "getattr", "weight", [], {}) is wrapper.weight  # data: the kernel gets a copy
    assert _operate(counting, "getattr", "vocab_size", [], {}) == 7
    assert counting.calls == 0


def test_messages_are_framed_and_bounded():
    a, b = socket.socketpair()
    with a, b:
        channel.send(a, json.dumps({"x": [1, 2]}))
        assert channel.receive(b) == {"x": [1, 2]}
        a.sendall((channel.MAX_BYTES + 1).to_bytes(8, "big"))
        with pytest.raises(channel.ChannelError, match="more than"):
            channel.receive(b)
        a.close()
        assert channel.receive(b) is None


@pytest.mark.parametrize("name", [
    "specdec.paths:os.popen",  # a module's import, walked to: ran shell commands as root in the grader (issue 51)
    "specdec.paths:os",
    "specdec.models.model:torch.load",  # unpickles
    "specdec.models.model:math.__builtins__",
    "specdec.bench.__main__:main",  # importing it runs a benchmark
    "specdec.params:SamplingParams.__init__.__globals__",
    "specdec.params:SamplingParams.__class__",
])
def test_a_kernel_cannot_name_anything_but_what_a_lesson_defines(name):
    for tag in ({"fn": name}, {"o": name, "state": [], "id": 0}, {"E": name, "name": "x"}):
        with pytest.raises(channel.ChannelError):
            channel.Decoder()(tag)


def test_a_kernel_cannot_make_the_grader_import_a_module(monkeypatch):
    import sys

    import specdec.lookup

    monkeypatch.delitem(sys.modules, "specdec.lookup")  # as if the grader had not loaded it
    with pytest.raises(channel.ChannelError, match="not loaded"):
        channel.Decoder()({"fn": "specdec.lookup:propose_ngram"})
    assert "specdec.lookup" not in sys.modules and specdec.lookup


def test_an_object_from_a_kernel_gets_its_data_fields_and_nothing_that_hides_its_class():
    from specdec.params import SamplingParams

    good = channel.Decoder()(channel.Encoder()(SamplingParams(0.7, top_k=5)))
    assert isinstance(good, SamplingParams) and good.temperature == 0.7 and good.top_k == 5
    for name, value in (("probs", {"fn": "specdec.params:SamplingParams"}), ("__class__", None), ("__dict__", {})):
        forged = {"o": "specdec.params:SamplingParams", "state": [["temperature", {"f": "1.0"}], [name, value]], "id": 0}
        with pytest.raises(channel.ChannelError, match="data fields"):
            channel.Decoder()(forged)
    with pytest.raises(channel.ChannelError, match="module"):
        channel.Decoder()({"o": "specdec.models.model:Llama", "state": [], "id": 0})
    # the grader's own messages still build what it sends (the kernel's decoder trusts its sender)
    assert channel.Decoder(trusted_sender=True)({"fn": "specdec.sampling:sample"}).__name__ == "sample"


def test_every_way_a_cell_binds_a_top_level_name_is_seen_and_locals_are_not():
    from specdec.course.trusted import _bound_names

    cell = """
import torch
from specdec.checks import expect_equal
def count_params(config):
    sum = 0
    for layer in range(3):
        sum += layer
    return sum
checks, x = 1, 2
for expect_close in []: pass
with open('/dev/null') as CheckFailure: pass
if (compare_frequencies := 3): pass
ys = [z for z in range(3)]
def helper():
    global MODELS
    MODELS = 1
try: pass
except Exception as len: pass
del print
"""
    assert _bound_names(cell) == {"count_params", "checks", "x", "expect_close", "CheckFailure", "compare_frequencies",
                                  "ys", "helper", "MODELS", "len", "print"}


def test_a_kernel_never_names_a_graded_reference_or_a_function_where_a_value_is_read():
    """Issue 51's review: a kernel described the learner's answer as a value naming the reference of the exercise
    ({"fn": "specdec.greedy:greedy_verify"}), and the test cell ran the reference in the grader."""
    import specdec.greedy  # noqa: F401 (loaded, as the checks load it)

    forged = {"fn": "specdec.greedy:greedy_verify"}
    with pytest.raises(channel.ChannelError, match="reference of an exercise"):
        channel.Decoder(refused_functions=frozenset({"greedy_verify"}))(forged)
    with pytest.raises(channel.ChannelError, match="value"):
        channel.Decoder(functions=False)(forged)
    assert channel.Decoder()(forged).__name__ == "greedy_verify"  # what the kernel's own decoder may read


def test_a_callback_never_runs_a_models_machinery():
    """Issue 51's review: load_state_dict (or a hook, or .half()) on a model a check handed over changed the grader's
    model for every check after it."""
    model = torch.nn.Linear(2, 2)
    before = model.weight.detach().clone()
    for name, args in (("load_state_dict", [{"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}]),
                       ("register_forward_hook", [print]), ("half", []), ("apply", [print]), ("train", [False])):
        with pytest.raises(AttributeError, match="torch.nn.Module"):
            _operate(model, "method", name, args, {})
    assert torch.equal(model.weight, before)
    assert _operate(model, "method", "forward", [torch.ones(1, 2)], {}).shape == (1, 2)
