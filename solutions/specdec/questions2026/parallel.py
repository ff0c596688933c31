"""Notebook 15, parallel drafting: a drafter that proposes gamma tokens in one forward, after PARD.

An, Yang, et al., "PARD: Accelerating LLM Inference with Low-Cost PARallel Draft Model Adaptation" (arXiv
2504.18583). A small autoregressive model learns one extra token id, the mask. To draft after x_0..x_t it reads
x_0..x_t followed by gamma - 1 masks at positions t+1..t+gamma-1, under the ordinary causal mask, and in that one
forward its output at x_t proposes x_{t+1} and its output at the j-th mask proposes x_{t+1+j}. Each later position
sees masks where an autoregressive draft would see its own earlier drafts, so its acceptance falls faster with
depth; in exchange drafting costs one forward whatever gamma.

Training puts many such chains in one sequence: the real tokens (depth 0), then for each depth k = 1..gamma-1 a
mask token at position a + k for each kept anchor a. A token's *anchor* is position - depth, the last real token its
chain may see. Conditional drop-token (COD): a chain is kept at depth k only where it was kept at depth k - 1, with
fewer anchors kept the deeper the chain (:func:`cod_layout`), so a training sequence grows by a fraction of its
length per depth, not by its length. Verification is the verifier's: exactness does not depend on how the drafts
were proposed, only on q being what each draft was drawn from.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from specdec.chain import verify_drafts
from specdec.engine import propose
from specdec.models.model import KVCache, Llama, LlamaConfig
from specdec.params import GREEDY, SamplingParams
from specdec.sampling import sample
from specdec.validate import check_positive_int


def mask_id(drafter: Llama) -> int:
    """The mask token: the drafter's last token id (the bytes are 0..255, the mask 256)."""
    return drafter.config.vocab_size - 1


def with_mask_token(draft: Llama) -> Llama:
    """A copy of ``draft`` with one more token id, the mask: its embedding starts at the mean of the others', its
    LM-head row at zero (it is never a label, and drafts never propose it)."""
    config = LlamaConfig(**{**draft.config.to_dict(), "vocab_size": draft.config.vocab_size + 1})
    drafter = Llama(config)
    state = draft.state_dict()
    state["embed_tokens.weight"] = torch.cat([state["embed_tokens.weight"],
                                              state["embed_tokens.weight"].mean(0, keepdim=True)])
    state["lm_head.weight"] = torch.cat([state["lm_head.weight"], torch.zeros_like(state["lm_head.weight"][:1])])
    drafter.load_state_dict(state)
    return drafter.eval()


def parallel_training_mask(positions: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """Which token of a parallel-drafting training sequence may attend to which.

    positions: (N,) integer, each token's position (the rotary position it is embedded at); depths: (N,) integer,
    0 for a real token, k >= 1 for a mask that stands k places after its chain's last real token (its anchor is
    position - depth). The tokens may come in any order. Returns (N, N) bool, True where query i may attend to key
    j: exactly what token i would see at inference, where the drafter reads the real tokens up to its anchor and then
    its chain's masks up to itself under a causal mask. Inputs are left as they are.
    """
    ### BEGIN SOLUTION
    positions, depths = positions.long(), depths.long()
    anchors = positions - depths  # (N,): the last real position each token's chain sees
    real_key = (depths == 0)[None, :]
    sees_real = real_key & (positions[None, :] <= anchors[:, None])
    sees_own_masks = ~real_key & (anchors[None, :] == anchors[:, None]) & (positions[None, :] <= positions[:, None])
    return sees_real | sees_own_masks
    ### END SOLUTION


def cod_layout(length: int, gamma: int, retain: Sequence[float], generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, depths) of a training sequence over ``length`` real tokens for drafts of up to ``gamma`` tokens:
    the real tokens, then the masks of depth 1..gamma-1. ``retain[k - 1]`` is the share of anchors whose chain
    reaches depth k (non-increasing); an anchor is kept at depth k only if kept at depth k - 1 (conditional
    drop-token), and only where its mask's label lies inside the window (position a + k <= length - 1)."""
    check_positive_int(length, "length")
    check_positive_int(gamma, "gamma")
    if len(retain) < gamma - 1 or any(not 0 <= r <= 1 for r in retain):
        raise ValueError(f"retain needs gamma - 1 = {gamma - 1} shares in [0, 1], got {list(retain)}")
    positions, depths = [torch.arange(length)], [torch.zeros(length, dtype=torch.long)]
    kept = torch.ones(length, dtype=torch.bool)  # anchors still alive
    u = torch.rand(length, generator=generator)  # one draw per anchor: its chain's depth is how far u stays below
    for k in range(1, gamma):
        kept = kept & (u < retain[k - 1]) & (torch.arange(length) + k <= length - 1)
        anchors = kept.nonzero().flatten()
        positions.append(anchors + k)
        depths.append(torch.full_like(anchors, k))
    return torch.cat(positions), torch.cat(depths)


def parallel_propose(drafter: Llama, cache: KVCache, feed: torch.Tensor, gamma: int, params: SamplingParams = GREEDY,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """gamma drafts per row in one forward of the parallel drafter.

    cache: the drafter's KV cache, holding real tokens only; feed: (B, n) the real tokens it does not hold yet (n
    >= 1; the last is the last committed token). One forward over feed and gamma - 1 mask tokens; the output at the
    last fed token proposes draft 1 and the output at mask j proposes draft j + 1, each drawn (with ``params``, from
    ``generator``) from its own distribution over the real ids 0..mask_id - 1. Afterwards the cache holds what it held
    plus ``feed``, no masks. Returns (drafts (B, gamma) long, q (B, gamma, mask_id) float64, what each was drawn from).
    """
    check_positive_int(gamma, "gamma")
    ### BEGIN SOLUTION
    B, n = feed.shape
    start = cache.length
    masks = torch.full((B, gamma - 1), mask_id(drafter), dtype=torch.long, device=feed.device)
    logits = drafter(torch.cat([feed.long(), masks], dim=1), cache)  # (B, n + gamma - 1, V + 1)
    cache.crop(start + n)  # the masks' keys and values are this round's only
    q = params.probs(logits[:, n - 1 :, : mask_id(drafter)])  # (B, gamma, V)
    return sample(q, generator), q
    ### END SOLUTION


class AutoregressiveProposer:
    """The course's draft, one cached forward per draft (notebook 05's propose)."""

    def __init__(self, draft: Llama) -> None:
        self.draft = draft

    def start(self, prompt: list[int]) -> None:
        self.cache = KVCache(self.draft.config)
        if len(prompt) > 1:
            self.draft(torch.tensor([prompt[:-1]]), self.cache)
        self.pending = list(prompt[-1:])

    def propose(self, gamma: int, params: SamplingParams, generator: torch.Generator | None):
        self.drafts, q = propose(self.draft, self.cache, self.pending, gamma, params, generator)
        return self.drafts, q

    def committed(self, P: int, committed: list[int]) -> None:
        k = len(committed) - 1
        if k < len(self.drafts):
            self.cache.crop(P + k)
            self.pending = [committed[-1]]
        else:
            self.pending = [self.drafts[-1], committed[-1]]


class ParallelProposer:
    """A parallel drafter: one forward per round, through ``propose`` (:func:`parallel_propose` or a learner's)."""

    def __init__(self, drafter: Llama, propose=None) -> None:
        self.drafter, self.propose_fn = drafter, propose or parallel_propose

    def start(self, prompt: list[int]) -> None:
        self.cache = KVCache(self.drafter.config)
        self.pending = list(prompt)

    def propose(self, gamma: int, params: SamplingParams, generator: torch.Generator | None):
        drafts, q = self.propose_fn(self.drafter, self.cache, torch.tensor([self.pending]), gamma, params, generator)
        return drafts[0].tolist(), q[0]

    def committed(self, P: int, committed: list[int]) -> None:
        self.pending = list(committed)  # the drafter fed masks where the drafts were: it reads every committed token


@torch.inference_mode()
def speculative_with_stats(target: Llama, proposer, prompt: list[int], n_tokens: int, gamma: int,
                           params: SamplingParams = GREEDY, generator: torch.Generator | None = None
                           ) -> tuple[list[int], dict]:
    """Notebook 05's loop with any proposer, timed: (tokens, stats) with stats = {"accepted": drafts accepted per
    round, "proposed": per round, "draft_s": seconds drafting, "verify_s": seconds verifying}."""
    cache, tokens = KVCache(target.config), list(prompt)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
    proposer.start(prompt)
    stats = {"accepted": [], "proposed": [], "draft_s": 0.0, "verify_s": 0.0}
    while len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        t0 = time.perf_counter()
        drafts, q = proposer.propose(gamma, params, generator)
        t1 = time.perf_counter()
        logits = target(torch.tensor([tokens[-1:] + drafts]), cache)[0]
        committed = verify_drafts(drafts, q, logits, params, generator)
        cache.crop(P + len(committed) - 1)
        stats["verify_s"] += time.perf_counter() - t1
        stats["draft_s"] += t1 - t0
        proposer.committed(P, committed)
        stats["accepted"].append(len(committed) - 1)
        stats["proposed"].append(len(drafts))
        tokens += committed
    return tokens[len(prompt) : len(prompt) + n_tokens], stats
