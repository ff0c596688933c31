"""The speculative decoding engine for the course's Llama models (batch 1), notebook 05.

One round: the draft proposes gamma tokens, one forward each from its KV cache
(:func:`propose`); the target scores the last committed token and the drafts in one
forward; verification decides what to commit (greedy_verify at temperature 0,
verify_chain otherwise); both caches are rolled back to what was committed
(:func:`rollback`). :func:`speculative_generate` is the loop; :func:`target_only_generate`
is plain decoding through the same cache code, so the two are timed alike.

Cache invariant at the start of a round, with P committed tokens: the target's cache
holds P - 1 entries (the last committed token is its next input); the draft's holds
P - len(pending), where ``pending`` is 1 token, or 2 after a full acceptance (its own
last draft, which it never fed, and the bonus).

:class:`SpeculativeEngine` runs the same functions with every forward recorded
(:class:`RecordingModel`), and derives per-round statistics from the record.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from specdec.chain import verify_chain
from specdec.greedy import greedy_verify
from specdec.model import KVCache, Llama
from specdec.sampling import probs_from_logits, sample
from specdec.validate import check_positive_int


@dataclass(frozen=True)
class SamplingParams:
    """Applied identically to draft and target: temperature 0 is greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V) logits -> the float64 distribution a token is drawn from (one-hot when greedy)."""
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p)


GREEDY = SamplingParams()


def check_vocabularies(target, draft) -> None:
    """A draft token id must mean what it means to the target: one tokenizer, so one vocabulary.

    Compares the logits' widths and, where both configs carry one (:mod:`specdec.pretrained`), a
    fingerprint of the tokenizer's id -> token map."""
    t, d = target.config, draft.config
    advice = ("Speculative decoding as written here needs one shared tokenizer: take the draft from the target's "
              "family. For a pair that does not share one, transformers' Universal Assisted Generation translates "
              "the drafts through text: generate(..., assistant_model=draft, tokenizer=target_tokenizer, "
              "assistant_tokenizer=draft_tokenizer).")
    fingerprints = getattr(t, "vocab_fingerprint", None), getattr(d, "vocab_fingerprint", None)
    if d.vocab_size != t.vocab_size:
        if None not in fingerprints and fingerprints[0] == fingerprints[1]:
            advice = ("Both use the same tokenizer, so only the LM heads' padding differs: "
                      "specdec.pretrained.share_vocabulary(target, draft) cuts both to the common width.")
        raise ValueError(f"draft and target vocabularies differ: the draft scores {d.vocab_size} token ids, the target "
                         f"{t.vocab_size}. {advice}")
    if None not in fingerprints and fingerprints[0] != fingerprints[1]:
        raise ValueError(f"draft and target vocabularies differ: both score {t.vocab_size} token ids, but their "
                         f"tokenizers map ids to different tokens. {advice}")


def check_request(target: Llama, draft: Llama | None, prompt: list[int], n_tokens: int, gamma: int) -> None:
    """Clear errors for a request the models cannot serve."""
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ValueError("the prompt must be a non-empty list of token ids")
    check_positive_int(n_tokens, "n_tokens")
    if draft is not None:
        check_positive_int(gamma, "gamma")
        check_vocabularies(target, draft)
    V = target.config.vocab_size
    if min(prompt) < 0 or max(prompt) >= V:
        raise ValueError(f"prompt token ids must lie in [0, {V}), got min {min(prompt)} and max {max(prompt)}")
    needed = len(prompt) + n_tokens + gamma + 1
    for name, model in (("target", target), ("draft", draft)):
        if model is not None and needed > model.config.max_seq_len:
            raise ValueError(
                f"prompt ({len(prompt)}) + n_tokens ({n_tokens}) + gamma + 1 ({gamma + 1}) = {needed} positions "
                f"exceed the {name}'s context of {model.config.max_seq_len}"
            )


@torch.inference_mode()
def target_only_generate(target: Llama, prompt: list[int], n_tokens: int, params: SamplingParams = GREEDY,
                         generator: torch.Generator | None = None) -> list[int]:
    """Plain decoding, one target forward per token: the baseline and the reference output."""
    check_request(target, None, prompt, n_tokens, 0)
    ### BEGIN SOLUTION
    cache = KVCache(target.config)
    tokens = list(prompt)
    if len(prompt) > 1:  # everything but the last token, which is the first step's input
        target(torch.tensor([prompt[:-1]]), cache)
    for _ in range(n_tokens):
        logits = target(torch.tensor([tokens[-1:]]), cache)[0, -1]  # (V,): the token after everything fed
        tokens.append(int(sample(params.probs(logits), generator)))
    return tokens[len(prompt):]
    ### END SOLUTION


@torch.inference_mode()
def propose(draft: Llama, cache: KVCache, pending: list[int], gamma: int, params: SamplingParams = GREEDY,
            generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor]:
    """The draft's gamma proposals, one cached forward each.

    ``pending``: the committed tokens the draft has not fed yet (1, or 2 after a full
    acceptance). Returns the drafts and q (gamma, V), float64: row i is the distribution
    draft i was drawn from. The last draft is never fed, so the cache grows by
    len(pending) + gamma - 1.
    """
    ### BEGIN SOLUTION
    drafts, q_rows, feed = [], [], list(pending)
    for _ in range(gamma):
        logits = draft(torch.tensor([feed]), cache)[0, -1]  # (V,): the token after everything fed so far
        q = params.probs(logits)
        drafts.append(int(sample(q, generator)))
        q_rows.append(q)
        feed = drafts[-1:]
    return drafts, torch.stack(q_rows)
    ### END SOLUTION


def rollback(target_cache: KVCache, draft_cache: KVCache, P: int, drafts: list[int], committed: list[int]) -> list[int]:
    """Crop both caches after a round that started with P committed tokens.

    ``drafts``: the gamma proposals; ``committed``: what verification committed (the
    accepted drafts, then the target's token). Returns the draft's pending input for the
    next round.
    """
    k = len(committed) - 1  # accepted drafts
    ### BEGIN SOLUTION
    target_cache.crop(P + k)  # the prefix and the accepted drafts; the new token has no KV yet
    if k < len(drafts):
        draft_cache.crop(P + k)
        return [committed[-1]]
    return [drafts[-1], committed[-1]]  # the draft never fed its last draft: it catches up next round
    ### END SOLUTION


@torch.inference_mode()
def speculative_generate(target: Llama, draft: Llama, prompt: list[int], n_tokens: int, gamma: int,
                         params: SamplingParams = GREEDY, generator: torch.Generator | None = None) -> list[int]:
    """n_tokens new tokens, distributed exactly as target_only_generate's (equal when greedy)."""
    check_request(target, draft, prompt, n_tokens, gamma)
    ### BEGIN SOLUTION
    target_cache, draft_cache = KVCache(target.config), KVCache(draft.config)
    tokens = list(prompt)
    if len(prompt) > 1:  # everything but the last token, which is the first round's input
        target(torch.tensor([prompt[:-1]]), target_cache)
        draft(torch.tensor([prompt[:-1]]), draft_cache)
    pending = tokens[-1:]
    while len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        drafts, q = propose(draft, draft_cache, pending, gamma, params, generator)
        logits = target(torch.tensor([tokens[-1:] + drafts]), target_cache)[0]  # (gamma + 1, V)
        if params.temperature == 0:
            committed = greedy_verify(torch.tensor(drafts), logits).tolist()
        else:
            committed = verify_chain(params.probs(logits), q, torch.tensor(drafts), generator).tolist()
        tokens += committed
        pending = rollback(target_cache, draft_cache, P, drafts, committed)
    return tokens[len(prompt) : len(prompt) + n_tokens]
    ### END SOLUTION


@dataclass(frozen=True)
class StopCriteria:
    """When a request ends: at its max_tokens-th new token, at a stop token, or at the token that
    completes a stop sequence (token ids: a stop string, encoded). Only new tokens count, never the
    prompt. The token that ends the request is part of the output."""

    max_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        check_positive_int(self.max_tokens, "max_tokens")
        if any(not seq for seq in self.stop_sequences):
            raise ValueError(f"every stop sequence needs at least one token, got {self.stop_sequences}")


def accept_until_stop(output: list[int], committed: list[int], stop: StopCriteria) -> tuple[list[int], bool]:
    """The part of a round's committed tokens to emit, and whether the request is finished.

    ``output``: the new tokens emitted in earlier rounds; ``committed``: this round's. The
    tokens are taken in order; the first one that is the max_tokens-th new token, a stop
    token, or the end of a stop sequence (which may begin in an earlier round) is the last
    one emitted.
    """
    if len(output) >= stop.max_tokens:
        raise ValueError(f"the request already has {len(output)} >= max_tokens = {stop.max_tokens} tokens")
    ### BEGIN SOLUTION
    text = list(output)
    for i, token in enumerate(committed):
        text.append(token)
        if (len(text) == stop.max_tokens or token in stop.stop_token_ids
                or any(text[-len(seq):] == list(seq) for seq in stop.stop_sequences)):
            return list(committed[: i + 1]), True
    return list(committed), False
    ### END SOLUTION


@torch.inference_mode()
def generate_until_stop(target: Llama, draft: Llama, prompt: list[int], stop: StopCriteria, gamma: int,
                        params: SamplingParams = GREEDY,
                        generator: torch.Generator | None = None) -> tuple[list[int], KVCache, KVCache]:
    """speculative_generate with stops: (output, target cache, draft cache). The output ends at
    the first stop (tokens committed after it are dropped); both caches are rolled back to the
    output, the target's holding every token but the last, so a next turn can continue."""
    check_request(target, draft, prompt, stop.max_tokens, gamma)
    ### BEGIN SOLUTION
    target_cache, draft_cache = KVCache(target.config), KVCache(draft.config)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), target_cache)
        draft(torch.tensor([prompt[:-1]]), draft_cache)
    output, pending, finished = [], list(prompt[-1:]), False
    while not finished:
        P = len(prompt) + len(output)
        drafts, q = propose(draft, draft_cache, pending, gamma, params, generator)
        last = output[-1:] or list(prompt[-1:])
        logits = target(torch.tensor([last + drafts]), target_cache)[0]  # (gamma + 1, V)
        if params.temperature == 0:
            committed = greedy_verify(torch.tensor(drafts), logits).tolist()
        else:
            committed = verify_chain(params.probs(logits), q, torch.tensor(drafts), generator).tolist()
        emitted, finished = accept_until_stop(output, committed, stop)
        output += emitted
        pending = rollback(target_cache, draft_cache, P, drafts, emitted)  # roll back to what was emitted
    return output, target_cache, draft_cache
    ### END SOLUTION


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
    """Wraps a Llama and records every forward (for statistics and for the checks)."""

    def __init__(self, model: Llama, keep_logits: bool = False) -> None:
        self.model, self.config, self.keep_logits, self.calls = model, model.config, keep_logits, []

    def __getattr__(self, name: str):  # parameters(), eval(), ...: the wrapped model's
        return getattr(self.model, name)

    def __call__(self, tokens: torch.Tensor, cache: KVCache | None = None, *args, **kwargs) -> torch.Tensor:
        before = cache.length if cache is not None else None
        start = time.perf_counter()
        out = self.model(tokens, cache, *args, **kwargs)
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


class SpeculativeEngine:
    """Generates with a target model, optionally speculating with a smaller draft, and
    reports per-round statistics and timings."""

    def __init__(self, target: Llama, draft: Llama | None = None) -> None:
        if draft is not None:
            check_vocabularies(target, draft)
        self.target, self.draft = target.eval(), draft.eval() if draft is not None else None

    def generate_target_only(self, prompt: list[int], n_tokens: int, params: SamplingParams = GREEDY,
                             generator: torch.Generator | None = None) -> Generation:
        target = RecordingModel(self.target)
        start = time.perf_counter()
        tokens = target_only_generate(target, prompt, n_tokens, params, generator)
        wall = time.perf_counter() - start
        return Generation(tokens, wall_s=wall, prefill_s=_prefill_s(len(prompt) > 1, target))

    def generate_lookup(self, prompt: list[int], n_tokens: int, gamma: int, params: SamplingParams = GREEDY,
                        generator: torch.Generator | None = None, n_max: int = 3, n_min: int = 1) -> Generation:
        """Speculative decoding with prompt-lookup proposals (no draft model), notebook 06."""
        from specdec.lookup import lookup_generate

        target = RecordingModel(self.target)
        start = time.perf_counter()
        tokens = lookup_generate(target, prompt, n_tokens, gamma, params, generator, n_max, n_min)
        wall = time.perf_counter() - start
        prefilled = len(prompt) > 1
        return Generation(tokens, rounds_from_calls(target.calls, [], prefilled), wall, _prefill_s(prefilled, target))

    def generate_tree(self, prompt: list[int], n_tokens: int, choices=None, params: SamplingParams = GREEDY,
                      generator: torch.Generator | None = None) -> Generation:
        """Speculative decoding with a tree of draft candidates (notebook 07); ``proposed``
        per round is the tree's depth, the most one round can accept."""
        from specdec.tree import DEFAULT_CHOICES, flatten_tree, tree_generate

        choices = choices or DEFAULT_CHOICES
        target, draft = RecordingModel(self.target), RecordingModel(self.draft)
        start = time.perf_counter()
        tokens = tree_generate(target, draft, prompt, n_tokens, choices, params, generator)
        wall = time.perf_counter() - start
        prefilled, depth = len(prompt) > 1, max(flatten_tree(choices).depths)
        rounds = rounds_from_calls(target.calls, draft.calls, prefilled, depth)
        return Generation(tokens, rounds, wall, _prefill_s(prefilled, target, draft))

    def generate(self, prompt: list[int], n_tokens: int, gamma: int, params: SamplingParams = GREEDY,
                 generator: torch.Generator | None = None) -> Generation:
        """Speculative decoding: the same output distribution as generate_target_only."""
        if self.draft is None:
            raise ValueError("no draft model: use generate_target_only, or pass a draft")
        target, draft = RecordingModel(self.target), RecordingModel(self.draft)
        start = time.perf_counter()
        tokens = speculative_generate(target, draft, prompt, n_tokens, gamma, params, generator)
        wall = time.perf_counter() - start
        prefilled = len(prompt) > 1
        rounds = rounds_from_calls(target.calls, draft.calls, prefilled, gamma)
        return Generation(tokens, rounds, wall, _prefill_s(prefilled, target, draft))
