"""Notebook 12, the speculative loops of the self-drafters, batch 1, on the course's KV cache.

The features are the LM head's input (after the final norm). Every loop keeps notebook 05's invariant:
with P committed tokens the target's cache holds P - 1
(the last committed token, the round's root, is its next input). The self-drafters read what the
target's verify forward computed anyway: Medusa the hidden state before the root, EAGLE the true
features of every accepted position (fed to its own one-layer cache at the next round's start;
features it predicted itself are thrown away with their KV). The loops run where the target is: their token
tensors are made on its device, and every clock read waits for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specdec.chain import verify_drafts
from specdec.drafters.dynamic_tree import expand_dynamic_tree
from specdec.drafters.eagle import EagleDrafter, eagle_draft_step, eagle_inputs
from specdec.drafters.eagle3 import FeatureDrafter
from specdec.drafters.medusa import MedusaHeads, medusa_candidates, medusa_head_logits
from specdec.models.devices import model_device, synchronize
from specdec.models.model import KVCache, Llama
from specdec.params import GREEDY, SamplingParams, check_request
from specdec.sampling import sample
from specdec.tree import Tree, _tree_attention_mask, compact_cache, flatten_tree, tree_mask, tree_position_ids, verify_tree

#: Medusa's tree for 4 heads: 3 candidates at depth 1, then narrower (16 nodes with the root).
MEDUSA_CHOICES = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
                  (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0)]


@dataclass
class DraftRun:
    """One generation: the new tokens and per-round counts (tau = mean committed per target forward)."""

    tokens: list[int]
    committed: list[int] = field(default_factory=list)  # tokens committed by each verify forward
    target_s: float = 0.0
    draft_s: float = 0.0
    wall_s: float = 0.0

    @property
    def tau(self) -> float:
        return sum(self.committed) / len(self.committed) if self.committed else float("nan")


def _prefill(target: Llama, prompt: list[int], params: SamplingParams,
             generator) -> tuple[KVCache, torch.Tensor, torch.Tensor, int]:
    """The whole prompt through the target: (cache, logits (L, V), features (L, d), the first new token)."""
    cache = KVCache(target.config)
    logits, features = target(torch.tensor([prompt]), cache, return_hidden=True)
    return cache, logits[0], features[0], int(sample(params.probs(logits[0, -1]), generator))


def _clock(device: torch.device) -> float:
    """time.perf_counter() once the work queued on ``device`` is done (a GPU runs its kernels after the launch)."""
    synchronize(device)
    return time.perf_counter()


def _check(target: Llama, prompt: list[int], n_tokens: int, width: int) -> None:
    check_request(target, None, prompt, n_tokens, 0)
    if len(prompt) + n_tokens + width > target.config.max_seq_len:
        raise ValueError(f"prompt + n_tokens + {width} speculative positions exceed the target's context")


@torch.inference_mode()
def medusa_generate(target: Llama, heads: MedusaHeads, prompt: list[int], n_tokens: int, choices=MEDUSA_CHOICES,
                    params: SamplingParams = GREEDY, generator: torch.Generator | None = None,
                    head_logits_fn=medusa_head_logits, candidates_fn=medusa_candidates) -> DraftRun:
    """Medusa: each round, the heads read the hidden state before the root and propose a Cartesian tree;
    one target forward verifies it (exact: the candidates are deterministic given the context).
    ``head_logits_fn`` and ``candidates_fn``: notebook 12's exercises (the reference's by default)."""
    tree = flatten_tree(choices)
    _check(target, prompt, n_tokens, len(tree))
    device = model_device(target)
    start_time = _clock(device)
    cache, _, features, root = _prefill(target, prompt, params, generator)
    mask, run, tokens = tree_mask(tree.parents), DraftRun([]), [root]
    hidden = features[-1]  # the feature that predicted the root
    while len(tokens) < n_tokens:
        t0 = _clock(device)
        head_logits = head_logits_fn(hidden, heads.res_weight, heads.res_bias, heads.out_weight)
        nodes = candidates_fn(root, head_logits, choices)
        t1 = _clock(device)
        start = cache.length
        logits, feats = target(torch.tensor([nodes]), cache, tree_position_ids(start, tree.depths),
                               _tree_attention_mask(start, mask), return_hidden=True)
        path, committed = verify_tree(torch.tensor(nodes), tree, logits[0], params, generator)
        compact_cache(cache, start, path)
        run.draft_s, run.target_s = run.draft_s + t1 - t0, run.target_s + _clock(device) - t1
        tokens += committed
        run.committed.append(len(committed))
        root, hidden = committed[-1], feats[0, path[-1]]
    run.tokens, run.wall_s = tokens[:n_tokens], _clock(device) - start_time
    return run


def _draft_logits_to_token(logits: torch.Tensor, params: SamplingParams, generator) -> tuple[int, torch.Tensor]:
    q = params.probs(logits)
    return int(sample(q, generator)), q


@torch.inference_mode()
def eagle_generate(target: Llama, drafter: EagleDrafter, prompt: list[int], n_tokens: int, gamma: int = 4,
                   params: SamplingParams = GREEDY, generator: torch.Generator | None = None,
                   inputs_fn=eagle_inputs, step_fn=eagle_draft_step) -> DraftRun:
    """EAGLE, a chain of gamma drafts per round from the drafter's own features, verified with notebook
    02's or 04's verifier (exact: q is what each draft was drawn from). ``inputs_fn``, ``step_fn``: notebook
    12's exercises (the reference's by default)."""
    _check(target, prompt, n_tokens, gamma + 1)
    device = model_device(target)
    start_time = _clock(device)
    cache, _, features, root = _prefill(target, prompt, params, generator)
    d_cache, run, tokens = drafter.new_cache(), DraftRun([]), [root]
    pending = inputs_fn(features, torch.tensor(prompt + [root], device=device))  # true (feature, next token) pairs not yet fed
    while len(tokens) < n_tokens:
        t0 = _clock(device)
        predicted = drafter(pending[0][None], target.embed_tokens(pending[1][None]), target, d_cache)[0, -1]
        kept = d_cache.length  # entries computed from true features: kept across rounds
        drafts, q_rows = [], []
        for j in range(gamma):
            if j:
                predicted, logits = step_fn(drafter, target, predicted, drafts[-1], d_cache)
            else:
                logits = target.lm_head(predicted)
            token, q = _draft_logits_to_token(logits, params, generator)
            drafts.append(token)
            q_rows.append(q)
        d_cache.crop(kept)  # entries from predicted features go: next round refeeds true ones
        t1 = _clock(device)
        P = len(prompt) + len(tokens)
        logits, feats = target(torch.tensor([[root] + drafts]), cache, return_hidden=True)
        committed = verify_drafts(drafts, torch.stack(q_rows), logits[0], params, generator)
        k = len(committed) - 1
        cache.crop(P + k)
        run.draft_s, run.target_s = run.draft_s + t1 - t0, run.target_s + _clock(device) - t1
        pending = inputs_fn(feats[0, : k + 1], torch.tensor([root] + committed, device=device))
        tokens += committed
        run.committed.append(len(committed))
        root = committed[-1]
    run.tokens, run.wall_s = tokens[:n_tokens], _clock(device) - start_time
    return run


@torch.inference_mode()
def eagle2_generate(target: Llama, drafter: EagleDrafter, prompt: list[int], n_tokens: int, depth: int = 5,
                    top_k: int = 4, budget: int = 15, params: SamplingParams = GREEDY,
                    generator: torch.Generator | None = None, tree_fn=expand_dynamic_tree) -> DraftRun:
    """EAGLE-2: a dynamic tree per round (expand_dynamic_tree over the drafter's tree-attended steps),
    verified in one target forward; exact (the tree's tokens are deterministic given the context).
    ``tree_fn``: notebook 12's exercise (the reference's by default)."""
    _check(target, prompt, n_tokens, max(budget + 1, (depth - 1) * top_k + 1))  # the drafter's tree entries too
    device = model_device(target)
    start_time = _clock(device)
    cache, _, features, root = _prefill(target, prompt, params, generator)
    d_cache, run, tokens = drafter.new_cache(), DraftRun([]), [root]
    pending = eagle_inputs(features, torch.tensor(prompt + [root], device=device))
    while len(tokens) < n_tokens:
        t0 = _clock(device)
        root_feature = drafter(pending[0][None], target.embed_tokens(pending[1][None]), target, d_cache)[0, -1]
        base, root_pos = d_cache.length, cache.length  # the root's token position is the target cache length
        feature_of, slot_of = {(): root_feature}, {}

        def expand(paths):
            fresh = [p for p in paths if p not in feature_of]
            if fresh:  # feed (parent's feature, token) for each, seeing the prefix, its ancestors and itself
                slots = [base + len(slot_of) + i for i in range(len(fresh))]
                visible = torch.zeros(len(fresh), d_cache.length + len(fresh), dtype=torch.bool)  # the attention moves it
                visible[:, :base] = True
                for row, (p, slot) in enumerate(zip(fresh, slots)):
                    visible[row, [slot_of[p[:j]] for j in range(1, len(p))] + [slot]] = True
                out = drafter(torch.stack([feature_of[p[:-1]] for p in fresh])[None],
                              target.embed_tokens(torch.tensor([[p[-1] for p in fresh]], device=device)), target, d_cache,
                              torch.tensor([root_pos + len(p) - 1 for p in fresh], device=device), visible)[0]
                for p, slot, f in zip(fresh, slots, out):
                    feature_of[p], slot_of[p] = f, slot
            return torch.log_softmax(target.lm_head(torch.stack([feature_of[p] for p in paths])), -1)

        paths = tree_fn(expand, depth, top_k, budget)
        d_cache.crop(base)
        t1 = _clock(device)
        index = {(): 0}
        for i, p in enumerate(paths):
            index[p] = i + 1
        parents = (-1,) + tuple(index[p[:-1]] for p in paths)
        tree = Tree(parents, (0,) + tuple(len(p) for p in paths), (0,) * (len(paths) + 1))
        nodes = [root] + [p[-1] for p in paths]
        start = cache.length
        logits, feats = target(torch.tensor([nodes]), cache, tree_position_ids(start, tree.depths),
                               _tree_attention_mask(start, tree_mask(parents)), return_hidden=True)
        path, committed = verify_tree(torch.tensor(nodes), tree, logits[0], params, generator)
        compact_cache(cache, start, path)
        run.draft_s, run.target_s = run.draft_s + t1 - t0, run.target_s + _clock(device) - t1
        pending = eagle_inputs(feats[0, path], torch.tensor([root] + committed, device=device))
        tokens += committed
        run.committed.append(len(committed))
        root = committed[-1]
    run.tokens, run.wall_s = tokens[:n_tokens], _clock(device) - start_time
    return run


@torch.inference_mode()
def feature_drafter_generate(target: Llama, drafter: FeatureDrafter, prompt: list[int], n_tokens: int, gamma: int = 4,
                             params: SamplingParams = GREEDY, generator: torch.Generator | None = None) -> DraftRun:
    """MTP-style and EAGLE-3-style drafting (notebook 13): ``eagle_generate``'s loop, with the drafter's fusion of
    the target's tapped layers as the true features and its own head (its draft vocabulary) for the drafts.
    Exact: each draft is verified against the q it was drawn from."""
    _check(target, prompt, n_tokens, gamma + 1)
    taps = drafter.config.taps
    device = model_device(target)
    start_time = _clock(device)
    cache = KVCache(target.config)
    logits, _, tapped = target(torch.tensor([prompt]), cache, taps=taps)
    root = int(sample(params.probs(logits[0, -1]), generator))
    d_cache, run, tokens = drafter.new_cache(), DraftRun([]), [root]
    # the true (feature, next token) pairs
    pending = eagle_inputs(drafter.fuse(tapped[0]), torch.tensor(prompt + [root], device=device))
    while len(tokens) < n_tokens:
        t0 = _clock(device)
        out = drafter(pending[0][None], pending[1][None], target, d_cache)[0, -1]  # step 1 from a true feature
        kept = d_cache.length
        drafts, q_rows = [], []
        for j in range(gamma):
            if j:  # step j + 1 reads the drafter's own output and its last draft
                out = drafter(out.view(1, 1, -1), torch.tensor([[drafts[-1]]], device=device), target, d_cache)[0, -1]
            token, q = _draft_logits_to_token(drafter.logits(out), params, generator)
            drafts.append(token)
            q_rows.append(q)
        d_cache.crop(kept)
        t1 = _clock(device)
        P = len(prompt) + len(tokens)
        logits, _, tapped = target(torch.tensor([[root] + drafts]), cache, taps=taps)
        committed = verify_drafts(drafts, torch.stack(q_rows), logits[0], params, generator)
        k = len(committed) - 1
        cache.crop(P + k)
        run.draft_s, run.target_s = run.draft_s + t1 - t0, run.target_s + _clock(device) - t1
        pending = eagle_inputs(drafter.fuse(tapped[0, : k + 1]), torch.tensor([root] + committed, device=device))
        tokens += committed
        run.committed.append(len(committed))
        root = committed[-1]
    run.tokens, run.wall_s = tokens[:n_tokens], _clock(device) - start_time
    return run
