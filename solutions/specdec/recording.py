"""The course's loops with every forward recorded: per-round statistics and timings (notebooks 05-07, 09).

:class:`SpeculativeEngine` runs notebook 05's :func:`~specdec.engine.speculative_generate`, notebook 06's
:func:`~specdec.lookup.lookup_generate` and notebook 07's :func:`~specdec.tree.tree_generate` on models
wrapped in :class:`RecordingModel`, and derives each round's proposed, accepted and committed counts and its
draft and target seconds from the record (:func:`rounds_from_calls`). The lesson modules know nothing of it.
The models may sit on a GPU: their forwards run there, their logits come back to the host (as
:class:`specdec.models.pretrained.PretrainedLM`'s do), and the loops, which make their tensors on the host, sample
and verify there, with a host generator. Every clock read waits for the models' device first.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from specdec.engine import speculative_generate, target_only_generate
from specdec.lookup import lookup_generate
from specdec.models.devices import logits_device, model_device, synchronize
from specdec.models.model import KVCache, Llama
from specdec.params import GREEDY, SamplingParams, check_vocabularies
from specdec.tree import DEFAULT_CHOICES, flatten_tree, tree_generate

_call_order = itertools.count()


@dataclass
class Call:
    """One recorded forward: the cache length before it, the tokens fed, its wall time."""

    order: int  # increasing across every RecordingModel, so two models' calls interleave
    cache_len: int | None  # None: called without a cache
    tokens: list[int]
    seconds: float
    cache: KVCache | None = field(repr=False, default=None)
    logits: torch.Tensor | None = field(repr=False, default=None)  # (T, V), with keep_logits


class RecordingModel:
    """Wraps a Llama and records every forward (for statistics and for the checks); a forward's time is its work
    on the model's device, waited for (on a GPU, the kernels run after the call returns). ``to_host``: return the
    logits on the host, so that a loop that makes its tensors there runs unchanged on a model on a GPU."""

    def __init__(self, model: Llama, keep_logits: bool = False, to_host: bool = False) -> None:
        self.model, self.config, self.keep_logits, self.calls = model, model.config, keep_logits, []
        self.device, self.to_host = model_device(model), to_host
        self.logits_device = torch.device("cpu") if to_host else logits_device(model)

    def __getattr__(self, name: str):  # parameters(), eval(), ...: the wrapped model's
        return getattr(self.model, name)

    def __call__(self, tokens: torch.Tensor, cache: KVCache | None = None, *args, **kwargs) -> torch.Tensor:
        before = cache.length if cache is not None else None
        synchronize(self.device)  # earlier work is not this forward's
        start = time.perf_counter()
        out = self.model(tokens, cache, *args, **kwargs)
        if self.to_host:
            out = tuple(t.cpu() for t in out) if isinstance(out, tuple) else out.cpu()
        synchronize(self.device)
        seconds = time.perf_counter() - start
        self.calls.append(Call(next(_call_order), before, tokens[0].tolist(), seconds, cache,
                               out[0].detach() if self.keep_logits else None))
        return out


@dataclass
class RoundStats:
    proposed: int
    accepted: int
    committed: int
    draft_s: float  # the draft's forwards (including a catch-up)
    target_s: float  # the target's verification forward
    target_cache_len: int  # after the rollback
    draft_cache_len: int


@dataclass
class Generation:
    tokens: list[int]  # the n_tokens new tokens
    rounds: list[RoundStats] = field(default_factory=list)
    wall_s: float = 0.0
    prefill_s: float = 0.0
    forward_s: float = 0.0  # every recorded forward of either model (prefill included): the rest of wall_s is other work

    @property
    def acceptance_rate(self) -> float:
        proposed = sum(r.proposed for r in self.rounds)
        return sum(r.accepted for r in self.rounds) / proposed if proposed else float("nan")

    @property
    def tokens_per_round(self) -> float:
        return sum(r.committed for r in self.rounds) / len(self.rounds) if self.rounds else float("nan")

    @property
    def other_s(self) -> float:
        """Wall time outside the model forwards: sampling, verification, Python."""
        return self.wall_s - self.prefill_s - sum(r.draft_s + r.target_s for r in self.rounds)


def rounds_from_calls(target_calls: list[Call], draft_calls: list[Call], prefilled: bool,
                      proposed: int | None = None) -> list[RoundStats]:
    """Per-round statistics of a recorded run: one target verification forward per round;
    a round's draft forwards are those recorded between its verification and the one before.
    ``proposed``: drafts per round (gamma, or a tree's depth); default: what the target was fed."""
    verify = target_calls[1:] if prefilled else target_calls
    drafts = draft_calls[1:] if prefilled else draft_calls
    rounds, previous = [], -1
    for i, call in enumerate(verify):
        after = verify[i + 1].cache_len if i + 1 < len(verify) else call.cache.length
        later = [c for c in drafts if c.order > call.order]
        draft_len = later[0].cache_len if later else (drafts[-1].cache.length if drafts else 0)
        draft_s = sum(c.seconds for c in drafts if previous < c.order < call.order)
        accepted = after - call.cache_len - 1
        n = proposed if proposed is not None else len(call.tokens) - 1
        rounds.append(RoundStats(n, accepted, accepted + 1, draft_s, call.seconds, after, draft_len))
        previous = call.order
    return rounds


def _prefill_s(prefilled: bool, *models: RecordingModel) -> float:
    return sum(m.calls[0].seconds for m in models) if prefilled else 0.0


def _forward_s(*models: RecordingModel) -> float:
    return sum(c.seconds for m in models for c in m.calls)


class SpeculativeEngine:
    """Generates with a target model, optionally speculating with a smaller draft, and
    reports per-round statistics and timings."""

    def __init__(self, target: Llama, draft: Llama | None = None) -> None:
        if draft is not None:
            check_vocabularies(target, draft)
        self.target, self.draft = target.eval(), draft.eval() if draft is not None else None
        self.device = model_device(target)

    def _clock(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    def generate_target_only(self, prompt: list[int], n_tokens: int, params: SamplingParams = GREEDY,
                             generator: torch.Generator | None = None) -> Generation:
        target = RecordingModel(self.target, to_host=True)
        start = self._clock()
        tokens = target_only_generate(target, prompt, n_tokens, params, generator)
        wall = self._clock() - start
        return Generation(tokens, wall_s=wall, prefill_s=_prefill_s(len(prompt) > 1, target), forward_s=_forward_s(target))

    def generate_lookup(self, prompt: list[int], n_tokens: int, gamma: int, params: SamplingParams = GREEDY,
                        generator: torch.Generator | None = None, n_max: int = 3, n_min: int = 1) -> Generation:
        """Speculative decoding with prompt-lookup proposals (no draft model), notebook 06."""
        target = RecordingModel(self.target, to_host=True)
        start = self._clock()
        tokens = lookup_generate(target, prompt, n_tokens, gamma, params, generator, n_max, n_min)
        wall = self._clock() - start
        prefilled = len(prompt) > 1
        return Generation(tokens, rounds_from_calls(target.calls, [], prefilled), wall, _prefill_s(prefilled, target),
                          _forward_s(target))

    def generate_tree(self, prompt: list[int], n_tokens: int, choices=None, params: SamplingParams = GREEDY,
                      generator: torch.Generator | None = None) -> Generation:
        """Speculative decoding with a tree of draft candidates (notebook 07); ``proposed``
        per round is the tree's depth, the most one round can accept."""
        choices = choices or DEFAULT_CHOICES
        target, draft = RecordingModel(self.target, to_host=True), RecordingModel(self.draft, to_host=True)
        start = self._clock()
        tokens = tree_generate(target, draft, prompt, n_tokens, choices, params, generator)
        wall = self._clock() - start
        prefilled, depth = len(prompt) > 1, max(flatten_tree(choices).depths)
        rounds = rounds_from_calls(target.calls, draft.calls, prefilled, depth)
        return Generation(tokens, rounds, wall, _prefill_s(prefilled, target, draft), _forward_s(target, draft))

    def generate(self, prompt: list[int], n_tokens: int, gamma: int, params: SamplingParams = GREEDY,
                 generator: torch.Generator | None = None) -> Generation:
        """Speculative decoding: the same output distribution as generate_target_only."""
        if self.draft is None:
            raise ValueError("no draft model: use generate_target_only, or pass a draft")
        target, draft = RecordingModel(self.target, to_host=True), RecordingModel(self.draft, to_host=True)
        start = self._clock()
        tokens = speculative_generate(target, draft, prompt, n_tokens, gamma, params, generator)
        wall = self._clock() - start
        prefilled = len(prompt) > 1
        rounds = rounds_from_calls(target.calls, draft.calls, prefilled, gamma)
        return Generation(tokens, rounds, wall, _prefill_s(prefilled, target, draft), _forward_s(target, draft))
