"""Notebook 14, self-speculation: the target's first layers and its own LM head are the draft.

LayerSkip (Elhoushi et al., ACL 2024, arXiv 2404.16710) needs no second model: it exits early and reuses the early
layers' work in verification. (Draft & Verify, Zhang et al., ACL 2024, arXiv 2309.08168, also drafts with the
target's own layers, but skips a chosen set of intermediate layers instead.) The draft runs the target's first
``exit_layer`` layers, then the final norm and the LM head; verification runs the rest. Nothing is computed twice:
the drafting forwards already wrote the early layers' KV for every position they fed and left their hidden states,
so verification feeds the early layers only the last draft (never fed while drafting) and runs the late layers over
the gamma + 1 positions from those hidden states. One KV cache serves both; after a round the cache is cut back to
the committed tokens, early and late layers alike.

Greedy verification keeps the output identical to target-only greedy decoding (in fp32 on the CPU: the same
operations on the same numbers). How often an early exit agrees with the full model is what LayerSkip's training
recipe (layer dropout rising with depth, an early-exit loss) is for; the course's target was not trained for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from specdec.models.model import KVCache, Llama
from specdec.validate import check_positive_int


def run_layers(model: Llama, x: torch.Tensor, layers: range, cache: KVCache, start: int) -> torch.Tensor:
    """Run ``layers`` of ``model`` on hidden states x (1, T, d) at positions start..start+T-1: each layer writes
    its K and V there and attends to what its cache holds before ``start``. Returns the hidden states after the
    last of them."""
    T = x.shape[1]
    cos, sin = model.rope_cos[start:start + T], model.rope_sin[start:start + T]
    cache.length = start
    for i in layers:
        x = model.layers[i](x, cos, sin, i, cache, None)
    return x


def exit_logits(model: Llama, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head's logits from hidden states taken at any layer: the final norm first, as after the last layer."""
    return model.lm_head(model.norm(hidden))


def embed(model: Llama, tokens: list[int]) -> torch.Tensor:
    """(1, len(tokens), d): the tokens' embeddings, the input of layer 0."""
    return model.embed_tokens(torch.tensor([tokens], device=model.embed_tokens.weight.device))


@torch.no_grad()
def layer_skip_generate(model: Llama, exit_layer: int, prompt: list[int], max_new_tokens: int,
                        gamma: int) -> tuple[list[int], dict]:
    """Greedy decoding of ``max_new_tokens`` tokens after ``prompt`` (at least one token), in rounds of up to
    ``gamma`` drafts from the first ``exit_layer`` layers (then :func:`exit_logits`), verified by the rest of
    ``model``. One KVCache serves both; no layer processes a position twice (except positions of rejected
    drafts, which the next round overwrites). The last round drafts no further than ``max_new_tokens``.
    Returns (tokens, stats) with stats = {"rounds", "proposed", "accepted"}."""
    n = model.config.n_layers
    check_positive_int(exit_layer, "exit_layer")
    check_positive_int(max_new_tokens, "max_new_tokens")
    check_positive_int(gamma, "gamma")
    if exit_layer >= n:
        raise ValueError(f"exit_layer must be below the model's {n} layers (the draft is a strict part), got {exit_layer}")
    if not prompt or len(prompt) + max_new_tokens > model.config.max_seq_len:
        raise ValueError(f"need a prompt of at least one token and prompt + max_new_tokens <= {model.config.max_seq_len}")
    cache = KVCache(model.config, max_len=len(prompt) + max_new_tokens + gamma + 1)
    ### BEGIN SOLUTION
    if len(prompt) > 1:  # every layer over the prompt but its last token, which the first round feeds
        run_layers(model, embed(model, prompt[:-1]), range(n), cache, 0)
    length, pending, out = len(prompt) - 1, prompt[-1], []
    stats = {"rounds": 0, "proposed": 0, "accepted": 0}
    while len(out) < max_new_tokens:
        g = min(gamma, max_new_tokens - len(out) - 1)
        drafts, early, token = [], [], pending
        for j in range(g):  # the draft: the early layers, then the final norm and the LM head
            hidden = run_layers(model, embed(model, [token]), range(exit_layer), cache, length + j)
            early.append(hidden)
            token = int(exit_logits(model, hidden)[0, -1].argmax())
            drafts.append(token)
        # verification: the early layers for the one position drafting never fed, then the late layers over all
        early.append(run_layers(model, embed(model, [token]), range(exit_layer), cache, length + g))
        hidden = run_layers(model, torch.cat(early, dim=1), range(exit_layer, n), cache, length)
        choice = exit_logits(model, hidden)[0].argmax(-1).tolist()  # (g + 1,)
        k = 0
        while k < g and drafts[k] == choice[k]:
            k += 1
        out += drafts[:k] + [choice[k]]
        length, pending = length + k + 1, choice[k]
        stats["rounds"] += 1
        stats["proposed"] += g
        stats["accepted"] += k
    return out, stats
    ### END SOLUTION


@contextlib.contextmanager
def positions_per_layer(model: Llama) -> Iterator[list[int]]:
    """Count, while the block runs, the token positions each layer of ``model`` processes: a list that fills in."""
    counts = [0] * model.config.n_layers
    hooks = [layer.register_forward_hook(lambda module, args, output, i=i: counts.__setitem__(i, counts[i] + output.shape[1]))
             for i, layer in enumerate(model.layers)]
    try:
        yield counts
    finally:
        for hook in hooks:
            hook.remove()
