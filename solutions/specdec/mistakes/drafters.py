"""Known-wrong answers to the exercises of notebook 12 (Medusa, EAGLE, EAGLE-2)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from specdec.drafters.medusa import ranked_tokens
from specdec.drafters.memory import drafter_cost
from specdec.mistakes import Mistake
from specdec.tree import check_choices


def _heads(hidden, res_weight, res_bias, out_weight, *, residual=True, act=F.silu, bias=True, transpose=True,
           shared=False):
    out = []
    for k in range(res_weight.shape[0]):
        w = res_weight[k].T if transpose else res_weight[k]
        inner = act(hidden @ w + (res_bias[k] if bias else 0))
        h = hidden + inner if residual else inner
        out.append(h @ out_weight[0 if shared else k].T)
    return torch.stack(out)


def _candidates(root, head_logits, choices, *, head=lambda depth, K: depth - 1, root_first=True, tie_high=False):
    paths = check_choices(choices)
    K = head_logits.shape[0]
    if tie_high:
        ranked = [sorted(range(row.shape[0]), key=lambda t: (-float(row[t]), -t)) for row in head_logits]
    else:
        ranked = [ranked_tokens(row) for row in head_logits]
    nodes = [ranked[head(len(p), K)][p[-1]] for p in paths]
    return [root] + nodes if root_first else nodes


def _inputs(features, tokens, *, shift=1, trim=0):
    n = max(min(features.shape[0], tokens.shape[0] - 1) - trim, 0)
    return features[:n], tokens[shift : shift + n]


def _step(drafter, target, feature, token, cache, *, use_cache=True, input_logits=False, give_back_input=False):
    embedding = target.embed_tokens(torch.tensor([[token]]))
    with torch.inference_mode():
        predicted = drafter(feature.view(1, 1, -1), embedding, target, cache if use_cache else None)[0, -1]
        logits = target.lm_head(feature if input_logits else predicted)
    return (feature if give_back_input else predicted), logits


def _tree(expand, depth, top_k, budget, *, value="sum", expand_all=False, rerank=True):
    created, frontier = [], [(0.0, ())]
    for _ in range(depth):
        logprobs = expand([p for _, p in frontier])
        new = []
        for (v, path), row in zip(frontier, logprobs):
            order = torch.sort(row, descending=True, stable=True).indices[:top_k].tolist()
            new += [((v if value == "sum" else 0.0) + float(row[t]), path + (t,)) for t in order]
        created += new
        ranked = sorted(range(len(new)), key=lambda i: (-new[i][0], i))
        frontier = [new[i] for i in (ranked if expand_all else ranked[:top_k])]
    if rerank:
        kept = sorted(range(len(created)), key=lambda i: (-created[i][0], i))[:budget]
    else:
        kept = list(range(min(budget, len(created))))
    return [created[i][1] for i in sorted(kept, key=lambda i: (len(created[i][1]), i))]


def _cost(kind, target, draft, batch_size, context, gamma, tree_nodes, bytes_per_value=2, num_heads=4, *, change=None):
    right = drafter_cost(kind, target, draft, batch_size, context, gamma, tree_nodes, bytes_per_value, num_heads)
    return change(right, kind, target, draft, batch_size, context, gamma, tree_nodes, bytes_per_value, num_heads) \
        if change else right


def _kv_half(cost, kind, *rest):
    return dataclasses.replace(cost, kv_bytes=cost.kv_bytes / 2)


def _medusa_kv(cost, kind, target, draft, B, ctx, gamma, nodes, b, K):
    if kind != "medusa":
        return cost
    return dataclasses.replace(cost, kv_bytes=2 * target.n_layers * target.n_kv_heads * target.head_dim * B * ctx * b)


def _eagle_whole_target(cost, kind, target, draft, B, ctx, gamma, nodes, b, K):
    if kind not in ("eagle", "eagle2"):
        return cost
    kv = 2 * target.n_layers * target.n_kv_heads * target.head_dim * B * ctx * b
    return dataclasses.replace(cost, kv_bytes=kv)


def _tree_as_chain(cost, kind, target, draft, B, ctx, gamma, nodes, b, K):
    return dataclasses.replace(cost, verify_tokens=gamma + 1) if kind in ("draft_tree", "medusa", "eagle2") else cost


def _medusa_forwards(cost, kind, *rest):
    return dataclasses.replace(cost, draft_forwards=rest[4]) if kind == "medusa" else cost


def _draft_no_embeddings(cost, kind, target, draft, B, ctx, gamma, nodes, b, K):
    if kind not in ("draft", "draft_tree"):
        return cost
    return dataclasses.replace(cost, weight_bytes=cost.weight_bytes - 2 * draft.vocab_size * draft.d_model * b)


def _m(exercise, name, fn, hint):
    return Mistake(exercise, name, fn, hint)


MISTAKES = [
    _m("medusa_head_logits", "no_residual", lambda *a, **k: _heads(*a, **k, residual=False),
       "each head is a residual block: h_k = hidden + SiLU(...). Without the '+ hidden' a freshly initialised head "
       "cannot start as the LM head."),
    _m("medusa_head_logits", "relu", lambda *a, **k: _heads(*a, **k, act=torch.relu), "the block's activation is SiLU (F.silu)."),
    _m("medusa_head_logits", "no_bias", lambda *a, **k: _heads(*a, **k, bias=False), "add res_bias[k] inside the SiLU."),
    _m("medusa_head_logits", "untransposed", lambda *a, **k: _heads(*a, **k, transpose=False),
       "weights are stored like nn.Linear's, (out, in): multiply by res_weight[k].T (and out_weight[k].T)."),
    _m("medusa_head_logits", "one_projection", lambda *a, **k: _heads(*a, **k, shared=True),
       "each head has its own vocabulary projection: out_weight[k] for head k."),
    _m("medusa_candidates", "head_zero_everywhere", lambda *a, **k: _candidates(*a, **k, head=lambda d, K: 0),
       "depth d takes its candidates from head d - 1: each head guesses a different position ahead."),
    _m("medusa_candidates", "head_offset", lambda *a, **k: _candidates(*a, **k, head=lambda d, K: min(d, K - 1)),
       "the token right after the root (depth 1) is head 0's guess: head k predicts k + 2 positions after the "
       "hidden state, and the root is the token 1 position after it. Depth d uses head d - 1."),
    _m("medusa_candidates", "no_root", lambda *a, **k: _candidates(*a, **k, root_first=False),
       "node 0 of the flattened tree is the root (the last committed token): put it first."),
    _m("medusa_candidates", "ties_to_higher_id", lambda *a, **k: _candidates(*a, **k, tie_high=True),
       "rank equal logits by increasing token id (a stable sort: torch.sort(..., stable=True))."),
    _m("eagle_inputs", "no_shift", lambda *a, **k: _inputs(*a, **k, shift=0),
       "the classic EAGLE off-by-one: the feature at t goes with the token at t + 1 (the token sampled from it), "
       "not the token at t (which the feature has already read)."),
    _m("eagle_inputs", "shift_two", lambda *a, **k: _inputs(*a, **k, shift=2),
       "pair features[t] with tokens[t + 1]: one position ahead, not two."),
    _m("eagle_inputs", "one_pair_short", lambda *a, **k: _inputs(*a, **k, trim=1),
       "every t that has a feature and a next token makes a pair: n = min(T, N - 1)."),
    _m("eagle_draft_step", "no_cache", lambda *a, **k: _step(*a, **k, use_cache=False),
       "feed the drafter with its cache: each step adds one entry and attends to every earlier one."),
    _m("eagle_draft_step", "logits_of_the_input", lambda *a, **k: _step(*a, **k, input_logits=True),
       "the draft logits come from the predicted feature (the next position's): target.lm_head(predicted), "
       "not from the feature you fed in, whose token is already known."),
    _m("eagle_draft_step", "returns_input_feature", lambda *a, **k: _step(*a, **k, give_back_input=True),
       "return the drafter's prediction (the next feature), not the feature you fed it."),
    _m("expand_dynamic_tree", "last_log_prob_as_value", lambda *a, **k: _tree(*a, **k, value="last"),
       "a node's value is the sum of the log-probabilities along its whole path (the product of probabilities), "
       "not its own log-probability: a confident child of an unlikely parent is still unlikely."),
    _m("expand_dynamic_tree", "expands_everything", lambda *a, **k: _tree(*a, **k, expand_all=True),
       "each step expands only the top_k new nodes by value: that is what keeps the drafter's work per step fixed."),
    _m("expand_dynamic_tree", "no_rerank", lambda *a, **k: _tree(*a, **k, rerank=False),
       "keep the budget nodes of highest value among all created nodes (the rerank), not the first ones created."),
    _m("drafter_cost", "kv_without_v", lambda *a, **k: _cost(*a, **k, change=_kv_half),
       "the KV cache holds K and V: 2 * layers * n_kv_heads * head_dim values per token."),
    _m("drafter_cost", "medusa_with_kv", lambda *a, **k: _cost(*a, **k, change=_medusa_kv),
       "Medusa heads read the target's hidden state: they have no KV cache of their own."),
    _m("drafter_cost", "eagle_kv_of_all_layers", lambda *a, **k: _cost(*a, **k, change=_eagle_whole_target),
       "EAGLE's drafter is one layer: its KV is one layer's, not the target's n_layers."),
    _m("drafter_cost", "tree_verifies_a_chain", lambda *a, **k: _cost(*a, **k, change=_tree_as_chain),
       "a tree's verify forward scores every node: tree_nodes positions, not gamma + 1."),
    _m("drafter_cost", "medusa_drafter_forwards", lambda *a, **k: _cost(*a, **k, change=_medusa_forwards),
       "Medusa's heads ride on the verify forward: no sequential drafter forward per round."),
    _m("drafter_cost", "draft_without_embeddings", lambda *a, **k: _cost(*a, **k, change=_draft_no_embeddings),
       "a separate draft model has its own embedding and LM head (2 * V * d parameters): count them."),
]
