"""The GPU path without a GPU: every loop of the library runs on a simulated accelerator and gives the CPU's tokens.

The simulated device is the CPU in disguise. Its tensors say they live on ``meta`` but hold CPU data, so every
operation really runs (and gives the CPU's numbers bit for bit); the dispatcher refuses what a GPU refuses: an
operation that mixes the device's tensors with host tensors (but for 0-dim host scalars, host index tensors and
copies between the two), and a random draw whose generator is on the other side. Its generators are CPU
generators that say they are on the device (the same stream). Its kernels can also run asynchronously on a fake
clock, so a timing that does not wait for the device reads the launch, not the work. A cache, a generator or a
tensor that stays on the CPU while the model is on the device fails here as it would on a GPU. (Token ids are
the exception by design: the course's Llama takes them from the host, :class:`specdec.models.model.TokenEmbedding`.)
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from specdec.checks.engine import tiny_pair
from specdec.models import devices
from specdec.models.model import KVCache, Llama, LlamaConfig
from specdec.params import SamplingParams

SIM, CPU = torch.device("meta"), torch.device("cpu")
aten = torch.ops.aten
CROSS = {aten._to_copy.default, aten.copy_.default, aten._local_scalar_dense.default}  # host <-> device, both sides
INDEX = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
SAMPLED = SamplingParams(temperature=0.9, top_k=5)


def _on_sim(device) -> bool:
    return device is not None and torch.device(device).type == SIM.type


class Clock:
    """Seconds as the host sees them: a kernel queues OP_SECONDS of device work; the host catches up when it
    waits for the device (synchronize, or reading a value back)."""

    OP_SECONDS = 1e-3

    def __init__(self) -> None:
        self.now, self.queued, self.running = 0.0, 0.0, False

    def launch(self) -> None:
        if self.running:
            self.queued += self.OP_SECONDS

    def wait(self, device=None) -> None:
        self.now, self.queued = self.now + self.queued, 0.0

    def perf_counter(self) -> float:
        return self.now


CLOCK = Clock()


class Sim(torch.Tensor):
    """A CPU tensor (``elem``) that reports the simulated device."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        with torch.inference_mode(False):  # a wrapper made in inference mode cannot be a view's output
            out = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype,
                                                      storage_offset=elem.storage_offset(), device=SIM)
        out.elem = elem
        return out

    def tolist(self):
        CLOCK.wait()
        return self.elem.tolist()

    def __repr__(self) -> str:
        return f"Sim({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


class SimGenerator(torch.Generator):
    """What ``torch.Generator`` is while the device is simulated: ``device=SIM`` gives a CPU generator (the CPU's
    stream) that says it is on the device."""

    def __new__(cls, device=CPU):
        return super().__new__(cls)

    def __init__(self, device=CPU) -> None:
        super().__init__()
        self.simulated = _on_sim(device)

    @property
    def device(self) -> torch.device:
        return SIM if self.simulated else CPU


def _tensors(x):
    """The tensors in an op's arguments (nested lists, tuples, dicts)."""
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        yield from _tensors(list(x.values()))
    elif isinstance(x, torch.Tensor):
        yield x


def _map(fn, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_map(fn, y) for y in x)
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    return fn(x) if isinstance(x, torch.Tensor) else x


def _unwrap(t: torch.Tensor) -> torch.Tensor:
    return t.elem if isinstance(t, Sim) else t


def _wrap(t: torch.Tensor) -> torch.Tensor:
    return t if isinstance(t, Sim) else Sim(t)


def _run(func, args, kwargs):
    tensors = list(_tensors((args, kwargs)))
    sims = [t for t in tensors if isinstance(t, Sim)]
    host = [t for t in tensors if not isinstance(t, Sim)]
    if any(t.device == SIM for t in host):  # made on the device by the binding, out of sight: no data behind it
        raise AssertionError(f"the simulation lost data: {func} got a real meta tensor; convert it in _Functions")
    if func in INDEX:  # index tensors may stay on the host: CUDA copies them over
        host = [t for t in host if not any(t is i for i in args[1] if i is not None)]
    if sims and func not in CROSS and any(t.dim() for t in host):
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, meta "
                           f"(simulated) and cpu! ({func} with host tensors of shapes {[tuple(t.shape) for t in host]})")
    device = kwargs.get("device")
    on_device = _on_sim(device) if device is not None else bool(sims)
    if func is aten.copy_.default:
        on_device = isinstance(args[0], Sim)
    if on_device:
        CLOCK.launch()
    elif sims and func in CROSS:  # a value or a copy back to the host waits for the device
        CLOCK.wait()
    unwrapped_args, unwrapped_kwargs = _map(_unwrap, args), _map(_unwrap, kwargs)
    if device is not None:
        unwrapped_kwargs["device"] = CPU
    out = func(*unwrapped_args, **unwrapped_kwargs)
    if func is aten.copy_.default:
        return args[0]
    return _map(_wrap, out) if on_device else out


class _Dispatch(TorchDispatchMode):
    """Factories (``torch.zeros(..., device=SIM)``); an op with a Sim among its arguments goes to Sim."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, Sim) for t in types):
            return NotImplemented
        kwargs = kwargs or {}
        if not _on_sim(kwargs.get("device")):  # the host's own work
            return func(*args, **kwargs)
        return _run(func, args, kwargs)


def _host_index(index):
    """A list of ints in an index, as a host tensor: left alone, the binding would make it a tensor on the indexed
    tensor's device, which for a Sim is a real meta tensor, without the data."""
    if isinstance(index, list) and all(isinstance(i, int) for i in index):
        return torch.tensor(index)
    return tuple(_host_index(i) for i in index) if isinstance(index, tuple) else index


class _Functions(TorchFunctionMode):
    """What the dispatcher cannot see: a draw's generator (it reaches the dispatcher re-wrapped, its device
    forgotten), and data the binding turns into tensors on the simulated device, out of the dispatcher's sight
    (``torch.tensor(data, device=SIM)``, a list in an index)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[0], Sim):
            args = (args[0], _host_index(args[1]), *args[2:])
        generator = kwargs.get("generator")
        if isinstance(generator, torch._C.Generator):
            device = kwargs.get("device")
            on_device = _on_sim(device) if device is not None else any(isinstance(t, Sim) for t in _tensors(args))
            if getattr(generator, "simulated", False) != on_device:
                raise RuntimeError(f"Expected a '{SIM.type if on_device else 'cpu'}' device type for generator but "
                                   f"found '{generator.device.type}' (simulated)")
        if func in (torch.tensor, torch.as_tensor) and _on_sim(kwargs.get("device")):
            return Sim(func(*args, **{**kwargs, "device": CPU}))
        return func(*args, **kwargs)


class Simulation:
    """``with sim:`` runs the block on the simulated device: its tensors, its generators, its clock (stopped until
    a test sets ``clock.running``) and its synchronize. Outside the block torch is itself: CPU references are
    computed there."""

    def __enter__(self) -> Clock:
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(torch, "Generator", SimGenerator)
        self.patch.setitem(devices.WAITS, SIM.type, CLOCK.wait)
        self.patch.setattr(time, "perf_counter", CLOCK.perf_counter)
        self.modes = [_Functions(), _Dispatch()]
        for mode in self.modes:
            mode.__enter__()
        return CLOCK

    def __exit__(self, *exc) -> None:
        for mode in reversed(self.modes):
            mode.__exit__(*exc)
        self.patch.undo()
        CLOCK.running = False


@pytest.fixture
def sim() -> Simulation:
    return Simulation()


def on_sim(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every parameter and buffer on the simulated device (the same values)."""
    model = copy.deepcopy(model)
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                module._parameters[name] = nn.Parameter(Sim(p.detach()), requires_grad=False)
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = Sim(b)
    return model


def host(x):
    """Sim tensors (anywhere in x) back as the CPU tensors they hold."""
    return _map(_unwrap, x)


@pytest.fixture(scope="module")
def pair() -> tuple[Llama, Llama]:
    return tiny_pair(vocab=32, noise=0.3, seed=1)


def sim_generator(seed: int) -> torch.Generator:
    """A seeded generator on the simulated device (inside ``with sim``): the CPU's stream for that seed."""
    return torch.Generator(device=SIM).manual_seed(seed)


# ---- the simulated device refuses what a GPU refuses --------------------------------------------------------
def test_the_simulated_device_refuses_mixing(sim, pair):
    target = on_sim(pair[0])
    with sim:
        probs = torch.softmax(torch.tensor([0.1, 0.5, 0.4], device=SIM), -1)
        assert probs.device == SIM and torch.equal(host(probs), torch.softmax(torch.tensor([0.1, 0.5, 0.4]), -1))
        with pytest.raises(RuntimeError, match="same device"):
            probs + torch.ones(3)
        with pytest.raises(RuntimeError, match="same device"):
            torch.nn.functional.embedding(torch.tensor([[1, 2]]), target.embed_tokens.weight)  # host token ids
        assert torch.equal(host(probs[[2, 0]]), host(probs)[[2, 0]])  # a list index is data, not a meta tensor
        with pytest.raises(RuntimeError, match="device type for generator"):
            torch.multinomial(probs, 1, generator=torch.Generator())
        with pytest.raises(RuntimeError, match="device type for generator"):
            torch.rand(3, generator=sim_generator(0))
        assert probs[torch.tensor([2, 0])].device == SIM and float(probs.sum() * torch.tensor(2.0)) == pytest.approx(2.0)
        drawn = torch.multinomial(probs, 8, replacement=True, generator=sim_generator(5))
        assert drawn.tolist() == torch.multinomial(host(probs), 8, replacement=True,
                                                   generator=torch.Generator().manual_seed(5)).tolist()


# ---- finding 1: caches follow the model ----------------------------------------------------------------------
def test_a_cache_follows_the_model_it_is_written_by(sim, pair):
    """KVCache(config) names no device: it must end up where the model writes it, not on the CPU."""
    chunks = [[1, 2, 3], [4, 5]]

    def forwards(model, device) -> torch.Tensor:
        cache = KVCache(model.config)
        with torch.inference_mode():
            logits = [model(torch.tensor([chunk], device=device), cache)[0] for chunk in chunks]
        assert cache.k.device == device and cache.length == 5
        return host(torch.cat(logits))

    want, model = forwards(pair[0], CPU), on_sim(pair[0])
    with sim:
        assert torch.equal(forwards(model, SIM), want)
        with pytest.raises(ValueError, match="KV cache is on cpu and the model writing it on meta"):
            model(torch.tensor([[1, 2]], device=SIM), KVCache(model.config, device="cpu"))


def test_a_cache_takes_the_model_dtype():
    """A bfloat16 model writes bfloat16 keys: the cache it reads them back from must hold bfloat16."""
    config = LlamaConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=32)
    torch.manual_seed(0)
    model = Llama(config).to(torch.bfloat16)
    cache = KVCache(config)
    with torch.inference_mode():
        out = torch.cat([model(torch.tensor([[1, 2, 3]]), cache), model(torch.tensor([[4]]), cache)], 1)
    assert cache.k.dtype == torch.bfloat16 and out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), model(torch.tensor([[1, 2, 3, 4]])).float(), atol=0.05)
    explicit = KVCache(config, dtype=torch.float64, max_len=8)
    assert explicit.k.dtype == torch.float64 and explicit.k.shape == (2, 1, 2, 8, 8) and explicit.k.device == CPU


def test_the_course_loops_run_where_the_model_is(sim, pair):
    """The course's loops (notebooks 05-07) create their tensors without a device: under torch.device(the model's)
    they run there (bench.gpu_check runs them so), and the caches they build follow."""
    from specdec.engine import generate_until_stop, speculative_generate, target_only_generate
    from specdec.lookup import lookup_generate
    from specdec.params import StopCriteria
    from specdec.tree import tree_generate

    target, draft = pair
    prompt = [1, 2, 3, 1, 2]
    runs = {
        "target only": lambda t, d, g: target_only_generate(t, prompt, 6, SAMPLED, g),
        "speculative greedy": lambda t, d, g: speculative_generate(t, d, prompt, 8, 3),
        "speculative sampled": lambda t, d, g: speculative_generate(t, d, prompt, 8, 3, SAMPLED, g),
        "until stop": lambda t, d, g: generate_until_stop(t, d, prompt, StopCriteria(6), 2, SAMPLED, g)[0],
        "lookup": lambda t, d, g: lookup_generate(t, prompt, 8, 2, SAMPLED, g),
        "tree": lambda t, d, g: tree_generate(t, d, prompt, 6, params=SAMPLED, generator=g),
    }
    want = {name: run(target, draft, torch.Generator().manual_seed(3)) for name, run in runs.items()}
    sim_target, sim_draft = on_sim(target), on_sim(draft)
    with sim, torch.device(SIM):
        for name, run in runs.items():
            assert run(sim_target, sim_draft, sim_generator(3)) == want[name], name


# ---- finding 2: generators (and every tensor) where the sampling happens -------------------------------------
def test_serving_requests_draw_on_the_model_device(sim, pair):
    from specdec.serving.engine import ServingEngine

    target = on_sim(pair[0])
    with sim:
        engine = ServingEngine(target, num_blocks=8, block_size=8)
        engine.add_request([1, 2, 3], 4, seed=7)
    assert engine.waiting[0].generator.device == SIM


def _serve(target, draft) -> dict[int, list[int]]:
    from specdec.serving.adaptive import StepCosts
    from specdec.serving.engine import ServingEngine

    costs = (StepCosts([1, 64], [1.0, 1.4]), StepCosts([1, 64], [0.1, 0.2]))
    engine = ServingEngine(target, draft, num_blocks=40, block_size=4, token_budget=24, max_gamma=4, costs=costs,
                           measure_gain=False, prefix_caching=True)
    for i, (gamma, params) in enumerate([(0, SamplingParams()), (3, SamplingParams()), (2, SAMPLED), (0, SAMPLED),
                                         ("auto", SamplingParams()), (3, SAMPLED)]):
        engine.add_request([1, 2, 3, 4, 5, 6, 7, 8, 9][: 3 + i], 7, params, gamma=gamma, seed=i)
    return {i: seq.output for i, seq in engine.run().items()}


def test_the_serving_engine_runs_where_the_model_is(sim, pair):
    """Paged caches, slot and position tensors, masks, embeddings' token ids and per-request generators on the
    model's device, with or without torch.device(it) around the engine (bench.gpu_check runs it inside); the
    outputs are the CPU engine's."""
    want, models = _serve(*pair), (on_sim(pair[0]), on_sim(pair[1]))
    with sim:
        assert _serve(*models) == want
        with torch.device(SIM):
            assert _serve(*models) == want


def test_the_recording_engine_runs_where_the_model_is(sim, pair):
    """SpeculativeEngine runs the course's loops on models anywhere, no device context needed: the forwards run on
    the models' device, the logits come back to the host, where the loops sample with a host generator."""
    from specdec.recording import SpeculativeEngine

    def generations(target, draft, g) -> list[list[int]]:
        engine = SpeculativeEngine(target, draft)
        return [engine.generate([1, 2, 3], 8, 3, SAMPLED, g()).tokens, engine.generate([4, 5], 6, 2).tokens,
                engine.generate_target_only([1, 2, 3], 5, SAMPLED, g()).tokens,
                engine.generate_lookup([1, 2, 1, 2], 6, 2, SAMPLED, g()).tokens,
                engine.generate_tree([1, 2, 3], 5, params=SAMPLED, generator=g()).tokens]

    want, models = generations(*pair, lambda: torch.Generator().manual_seed(2)), (on_sim(pair[0]), on_sim(pair[1]))
    with sim:
        assert generations(*models, lambda: torch.Generator().manual_seed(2)) == want


def _drafters(target):
    from specdec.drafters.eagle import EagleDrafter
    from specdec.drafters.eagle3 import FeatureDrafter, FeatureDrafterConfig
    from specdec.drafters.medusa import MedusaHeads

    c = target.config
    torch.manual_seed(0)
    heads, eagle = MedusaHeads(c.d_model, c.vocab_size, 4), EagleDrafter(c)
    feature = FeatureDrafter(FeatureDrafterConfig(c.d_model, c.vocab_size, (1, 2), tuple(range(0, c.vocab_size, 2)),
                                                  width=16, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=c.max_seq_len))
    with torch.no_grad():
        for p in [*heads.parameters(), *eagle.parameters(), *feature.parameters()]:
            p.copy_(torch.randn_like(p) * 0.5)
    return heads.eval(), eagle.eval(), feature.eval()


def test_the_self_drafting_loops_run_where_the_model_is(sim, pair):
    from specdec.drafters.generate import eagle2_generate, eagle_generate, feature_drafter_generate, medusa_generate

    def runs(target, heads, eagle, feature, g) -> list[list[int]]:
        prompt = [1, 2, 3, 4]
        return [medusa_generate(target, heads, prompt, 6, [(0,), (1,), (0, 0), (0, 0, 0)], SAMPLED, g()).tokens,
                medusa_generate(target, heads, prompt, 6).tokens,
                eagle_generate(target, eagle, prompt, 6, 3, SAMPLED, g()).tokens,
                eagle2_generate(target, eagle, prompt, 6, depth=3, top_k=2, budget=5, params=SAMPLED, generator=g()).tokens,
                feature_drafter_generate(target, feature, prompt, 6, 3, SAMPLED, g()).tokens]

    target, drafters = pair[0], _drafters(pair[0])
    want, models = runs(target, *drafters, lambda: torch.Generator().manual_seed(4)), [on_sim(target), *map(on_sim, drafters)]
    with sim:
        assert runs(*models, lambda: sim_generator(4)) == want


def test_the_production_and_frontier_loops_run_where_the_model_is(sim, pair):
    from specdec.drafts import expected_acceptance
    from specdec.frontier.layerskip import layer_skip_generate
    from specdec.production.grammar import Grammar, constrained_generate, constrained_target_only
    from specdec.production.suffix import SuffixProposer, proposer_generate
    from specdec.serving.numerics import decode_vs_verify

    grammar = Grammar("(\x01[\x02-\x09]*\x0a|[\x0b-\x1f]\x00)+\x1f?\x1e", vocab_size=32)

    def runs(target, draft, g) -> list:
        suffix = SuffixProposer()
        suffix.start("r", [1, 2, 3, 1, 2])
        return [proposer_generate(target, [1, 2, 3, 1, 2], 6, lambda t: suffix.propose("r", t, 3), SAMPLED, g(),
                                  lambda c: suffix.commit("r", c)),
                constrained_target_only(target, [3, 4, 5], 6, grammar, SAMPLED, g()),
                constrained_generate(target, draft, [3, 4, 5], 8, grammar, 3, SAMPLED, g()),
                constrained_generate(target, draft, [7, 1], 8, grammar, 3, draft_follows_grammar=False),
                layer_skip_generate(target, 1, [1, 2, 3], 6, 3),
                host(expected_acceptance(target, draft, [1, 2, 3, 4], SAMPLED)).tolist(),
                decode_vs_verify(target, [list(range(1, 20))], torch.float32, True, context=10, positions=6).positions]

    want, models = runs(*pair, lambda: torch.Generator().manual_seed(6)), (on_sim(pair[0]), on_sim(pair[1]))
    with sim:
        assert runs(*models, lambda: sim_generator(6)) == want


# ---- finding 3: a timing waits for the device ----------------------------------------------------------------
def test_timings_wait_for_the_device(sim, pair):
    """On the fake clock a forward's kernels take OP_SECONDS each, asynchronously: a forward timed without
    waiting for the device before reading the clock measures nothing."""
    from specdec.recording import RecordingModel
    from specdec.serving.engine import ServingEngine

    target, draft = on_sim(pair[0]), on_sim(pair[1])
    with sim as clock, torch.inference_mode():
        clock.running = True
        recorded = RecordingModel(target)
        recorded(torch.tensor([[1, 2, 3]], device=SIM))
        costs = ServingEngine(target, draft, block_size=8).measure_costs(rows=(1, 2), per_row=(1, 3), context=8)
    assert recorded.calls[0].seconds > 10 * clock.OP_SECONDS, "the forward was timed by its launch"
    for name, measured in zip(("target", "draft"), costs):
        assert min(min(line) for line in measured.seconds) > 10 * clock.OP_SECONDS, f"the {name}'s forwards were not waited for"


def test_synchronize_waits_only_on_an_accelerator(monkeypatch):
    waited = []
    monkeypatch.setitem(devices.WAITS, "cuda", waited.append)
    devices.synchronize("cpu")
    devices.synchronize(torch.device("cuda", 1))
    assert waited == [torch.device("cuda", 1)]
    assert devices.model_device(nn.Linear(2, 2)) == CPU and devices.model_device(nn.ReLU()) == CPU
