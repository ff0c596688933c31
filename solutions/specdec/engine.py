"""The speculative decoding engine for the course's Llama models (batch 1).

Each round: the draft proposes gamma tokens one at a time from its KV cache, the target
scores the last committed token and the drafts in one forward, verification decides
what to commit (greedy_verify at temperature 0, verify_chain otherwise), and both caches
are rolled back to what was committed. Target-only decoding runs through the same
cache code, so the two are timed alike.

Cache invariant at the start of a round, with P committed tokens: the target's cache
holds P - 1 entries (the last committed token is its next input); the draft's holds
P - len(pending), where ``pending`` is 1 token, or 2 after a full acceptance (its own
last draft, which it never fed, and the bonus).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specdec.chain import verify_chain
from specdec.greedy import greedy_verify
from specdec.model import KVCache, Llama
from specdec.sampling import probs_from_logits
from specdec.validate import check_positive_int


@dataclass(frozen=True)
class SamplingParams:
    """Applied identically to draft and target: temperature 0 is greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p)


@dataclass
class RoundStats:
    proposed: int
    accepted: int
    committed: int
    draft_s: float
    target_s: float
    target_cache_len: int  # after the rollback
    draft_cache_len: int


@dataclass
class Generation:
    tokens: list[int]  # the n_tokens new tokens
    rounds: list[RoundStats] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        proposed = sum(r.proposed for r in self.rounds)
        return sum(r.accepted for r in self.rounds) / proposed if proposed else float("nan")

    @property
    def tokens_per_round(self) -> float:
        return sum(r.committed for r in self.rounds) / len(self.rounds) if self.rounds else float("nan")


class SpeculativeEngine:
    """Generates with a target model, optionally speculating with a smaller draft."""

    def __init__(self, target: Llama, draft: Llama | None = None) -> None:
        if draft is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(
                f"draft and target vocabularies differ ({draft.config.vocab_size} vs {target.config.vocab_size}); "
                "they must share a tokenizer"
            )
        self.target, self.draft = target.eval(), draft.eval() if draft is not None else None

    def _check(self, prompt: list[int], n_tokens: int, gamma: int) -> None:
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        check_positive_int(n_tokens, "n_tokens")
        V = self.target.config.vocab_size
        if min(prompt) < 0 or max(prompt) >= V:
            raise ValueError(f"prompt token ids must lie in [0, {V})")
        needed = len(prompt) + n_tokens + gamma + 1
        for name, model in (("target", self.target), ("draft", self.draft)):
            if model is not None and needed > model.config.max_seq_len:
                raise ValueError(
                    f"prompt ({len(prompt)}) + n_tokens ({n_tokens}) + gamma + 1 ({gamma + 1}) = {needed} positions "
                    f"exceed the {name}'s context of {model.config.max_seq_len}"
                )

    @torch.no_grad()
    def generate_target_only(self, prompt: list[int], n_tokens: int, params: SamplingParams = SamplingParams(),
                             generator: torch.Generator | None = None) -> Generation:
        """Plain decoding with the target: one forward per token."""
        self._check(prompt, n_tokens, 0)
        start = time.perf_counter()
        cache = KVCache(self.target.config)
        tokens = list(prompt)
        if len(prompt) > 1:
            self.target(torch.tensor([prompt[:-1]]), cache)
        for _ in range(n_tokens):
            logits = self.target(torch.tensor([[tokens[-1]]]), cache)[0, -1]
            tokens.append(int(torch.multinomial(params.probs(logits), 1, generator=generator)))
        return Generation(tokens[len(prompt):], wall_s=time.perf_counter() - start)

    @torch.no_grad()
    def generate(self, prompt: list[int], n_tokens: int, gamma: int, params: SamplingParams = SamplingParams(),
                 generator: torch.Generator | None = None) -> Generation:
        """Speculative decoding: the same output distribution as generate_target_only."""
        if self.draft is None:
            raise ValueError("no draft model: use generate_target_only, or pass a draft")
        check_positive_int(gamma, "gamma")
        self._check(prompt, n_tokens, gamma)
        start = time.perf_counter()
        t_cache, d_cache = KVCache(self.target.config), KVCache(self.draft.config)
        tokens = list(prompt)
        if len(prompt) > 1:
            self.target(torch.tensor([prompt[:-1]]), t_cache)
            self.draft(torch.tensor([prompt[:-1]]), d_cache)
        pending = [tokens[-1]]
        result = Generation([])
        while len(tokens) - len(prompt) < n_tokens:
            P = len(tokens)
            t0 = time.perf_counter()
            drafts, q_rows, feed = [], [], pending
            for _ in range(gamma):
                q = params.probs(self.draft(torch.tensor([feed]), d_cache)[0, -1])  # (V,)
                y = int(torch.multinomial(q, 1, generator=generator))
                drafts.append(y)
                q_rows.append(q)
                feed = [y]
            t1 = time.perf_counter()
            logits = self.target(torch.tensor([[tokens[-1], *drafts]]), t_cache)[0]  # (gamma + 1, V)
            if params.temperature == 0:
                committed = greedy_verify(torch.tensor(drafts), logits).tolist()
            else:
                committed = verify_chain(params.probs(logits), torch.stack(q_rows), torch.tensor(drafts), generator).tolist()
            t2 = time.perf_counter()
            k = len(committed) - 1
            tokens += committed
            t_cache.crop(P + k)  # keep the prefix and the accepted drafts; the new token is the next input
            if k < gamma:
                d_cache.crop(P + k)
                pending = [committed[-1]]
            else:  # the draft never fed its last draft: feed it with the bonus next round
                pending = [drafts[-1], committed[-1]]
            result.rounds.append(RoundStats(gamma, k, k + 1, t1 - t0, t2 - t1, t_cache.length, d_cache.length))
        result.tokens = tokens[len(prompt) : len(prompt) + n_tokens]
        result.wall_s = time.perf_counter() - start
        return result
