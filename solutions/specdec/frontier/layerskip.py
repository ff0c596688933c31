"""Notebook 14, self-speculation: the target's first layers and its own LM head are the draft.

LayerSkip (Elhoushi et al., ACL 2024, arXiv 2404.16710) and Draft & Verify (Zhang et al., ACL 2024) need no second
model. The draft runs the target's first ``exit_layer`` layers, then the final norm and the LM head; verification
runs the rest. Nothing is computed twice: the drafting forwards already wrote the early layers' KV for every
position they fed and left their hidden states, so verification feeds the early layers only the last draft (never
fed while drafting) and runs the late layers over the gamma + 1 positions from those hidden states. One KV cache
serves both; after a round the cache is cut back to the committed tokens, early and late layers alike.

Greedy verification keeps the output identical to target-only greedy decoding (in fp32 on the CPU: the same
operations on the same numbers). How often an early exit agrees with the full model is what LayerSkip's training
recipe (layer dropout rising with depth, an early-exit loss) is for; an untrained exit, as here, agrees less.
"""

from __future__ import annotations

import torch

from specdec.models.model import KVCache, Llama
from specdec.validate import check_positive_int


class LayerSkipDecoder:
    """Greedy self-speculative decoding of one sequence with ``model``'s first ``exit_layer`` layers as the draft.

    ``cache`` holds positions 0..length-1 in every layer; ``pending`` is the last committed token, not yet fed.
    Counts what it computes: ``layer_tokens[i]`` = token positions layer i processed (the proof that no early
    layer runs twice on a position that was kept).
    """

    def __init__(self, model: Llama, exit_layer: int) -> None:
        n = model.config.n_layers
        check_positive_int(exit_layer, "exit_layer")
        if exit_layer >= n:
            raise ValueError(f"exit_layer must be below the model's {n} layers (the draft is a strict part), got {exit_layer}")
        self.model, self.exit_layer = model.eval(), exit_layer
        self.layer_tokens = [0] * n

    def _layers(self, x: torch.Tensor, layers: range, cache: KVCache, start: int) -> torch.Tensor:
        """Run ``layers`` on hidden states x (1, T, d) at positions start..start+T-1, writing their KV there."""
        m, T = self.model, x.shape[1]
        cos, sin = m.rope_cos[start:start + T], m.rope_sin[start:start + T]
        cache.length = start  # every layer writes at start..start+T-1 and attends to what lies before
        for i in layers:
            x = m.layers[i](x, cos, sin, i, cache, None)
            self.layer_tokens[i] += T
        return x

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.norm(x))

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new_tokens: int, gamma: int) -> tuple[list[int], dict]:
        """Greedy decoding of ``max_new_tokens`` tokens after ``prompt`` with rounds of ``gamma`` early-exit drafts.
        Returns (tokens, stats): stats has the rounds, the drafts proposed and accepted."""
        check_positive_int(max_new_tokens, "max_new_tokens")
        check_positive_int(gamma, "gamma")
        m, L, n = self.model, self.exit_layer, self.model.config.n_layers
        if len(prompt) + max_new_tokens > m.config.max_seq_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceed max_seq_len {m.config.max_seq_len}")
        cache = KVCache(m.config, max_len=len(prompt) + max_new_tokens + gamma + 1)
        ### BEGIN SOLUTION
        x = self._layers(m.embed_tokens(torch.tensor([prompt[:-1]])), range(n), cache, 0) if len(prompt) > 1 else None
        length, pending, out = len(prompt) - 1, prompt[-1], []
        stats = {"rounds": 0, "proposed": 0, "accepted": 0}
        while len(out) < max_new_tokens:
            g = min(gamma, max_new_tokens - len(out) - 1)
            drafts, early = [], []
            token = pending
            for j in range(g):  # the draft: early layers, final norm, LM head
                h = self._layers(m.embed_tokens(torch.tensor([[token]])), range(L), cache, length + j)
                early.append(h)
                token = int(self._logits(h)[0, -1].argmax())
                drafts.append(token)
            # verification: the early layers for the last draft only (or the pending token if no draft), then the
            # late layers over every position from the early hidden states
            last = drafts[-1] if drafts else pending
            early.append(self._layers(m.embed_tokens(torch.tensor([[last]])), range(L), cache, length + g))
            h = self._layers(torch.cat(early, dim=1), range(L, n), cache, length)
            choice = self._logits(h)[0].argmax(-1).tolist()  # (g + 1,)
            k = 0
            while k < g and drafts[k] == choice[k]:
                k += 1
            committed = drafts[:k] + [choice[k]]
            out += committed
            length, pending = length + k + 1, committed[-1]
            stats["rounds"] += 1
            stats["proposed"] += g
            stats["accepted"] += k
        cache.length = length
        return out[:max_new_tokens], stats
        ### END SOLUTION
