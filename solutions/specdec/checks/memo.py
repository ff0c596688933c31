"""A model that answers a forward it has already computed from memory: the same outputs, bit for bit.

The sampling checks run a learner's loop a thousand times or more on a tiny model (vocabulary 6,
three new tokens), so the same forwards come back again and again: the same prefix in the cache,
the same tokens fed. Each costs about a millisecond of nn.Module overhead; a dictionary lookup costs
a few microseconds. :func:`memoized` wraps a :class:`~specdec.models.model.Llama` so that a forward is
computed once per distinct input and replayed after that.

A replay is exact, not approximate: the key is everything the forward reads (the tokens, the cache's
valid K and V entries byte for byte, its length and size, the thread count, the weights' version
counters), and a replay does what the forward does to the cache (writes the same K and V after the valid
entries, raising where the forward would, then ``advance``) and returns a fresh copy of the same logits.
Anything unusual (a mask, position ids, hidden states, a cache of another class, autograd on, tokens
that are not a (B, T) long tensor) runs the real forward unmemoized. So a check sees the same numbers,
draws the same random numbers and gives the same verdict as on the plain model, for any implementation,
right or wrong; tests/test_checks.py compares the two on the reference and on catalogued mistakes.
"""

from __future__ import annotations

import torch

from specdec.models.model import KVCache, Llama

MAX_ENTRIES = 200_000  # a few hundred bytes each; past this, forwards still run, only uncached


class _Memoized(Llama):
    """The wrapped model's own parameters and modules (shared, not copied), with a memory of forwards."""

    _memo: dict
    _params: tuple

    def forward(self, tokens, cache=None, *more, **options):
        key = None if more or not all(_default(v) for v in options.values()) else self._key(tokens, cache)
        if key is None:  # position ids, a mask, hidden states...: the real forward, every time
            return super().forward(tokens, cache, *more, **options)
        hit = self._memo.get(key)
        if hit is None:
            start = cache.length if cache is not None else 0
            logits = super().forward(tokens, cache)
            if len(self._memo) < MAX_ENTRIES:
                end = start + tokens.shape[1]
                new_kv = None if cache is None else (cache.k[:, :, :, start:end].clone(), cache.v[:, :, :, start:end].clone())
                self._memo[key] = (logits.detach().clone(), new_kv)
            return logits
        logits, new_kv = hit
        if cache is not None:  # what the forward does to the cache: write every layer's K and V, then advance
            T = tokens.shape[1]
            if cache.length + T > cache.max_len:
                cache.write(0, new_kv[0][0], new_kv[1][0])  # raises the forward's overflow error
            cache.k.narrow(3, cache.length, T).copy_(new_kv[0])
            cache.v.narrow(3, cache.length, T).copy_(new_kv[1])
            cache.advance(T)
        return logits.clone()

    def _key(self, tokens, cache) -> tuple | None:
        if (torch.is_grad_enabled() or type(tokens) is not torch.Tensor or tokens.dtype != torch.long or tokens.dim() != 2
                or tokens.device.type != "cpu" or tokens.requires_grad):
            return None
        versions = tuple(p._version for p in self._params)
        if cache is None:
            return versions, torch.get_num_threads(), tuple(tokens.shape), tokens.numpy().tobytes(), None
        if (type(cache) is not KVCache or type(cache.k) is not torch.Tensor or type(cache.v) is not torch.Tensor
                or cache.k.device.type != "cpu" or cache.k.dtype != torch.float32 or cache.v.dtype != torch.float32
                or cache.k.requires_grad or cache.v.requires_grad):
            return None
        L = cache.length
        return (versions, torch.get_num_threads(), tuple(tokens.shape), tokens.numpy().tobytes(),
                (L, cache.max_len, tuple(cache.k.shape), tuple(cache.v.shape),
                 cache.k.narrow(3, 0, L).numpy().tobytes(), cache.v.narrow(3, 0, L).numpy().tobytes()))


def _default(value) -> bool:
    """An option left at its default (None, False or an empty tuple): the plain forward's case."""
    return value is None or value is False or (type(value) is tuple and not value)


def memoized(model: Llama) -> Llama:
    """``model`` with a memory of its forwards: the same parameters, the same outputs (see the module's docstring)."""
    fast = _Memoized.__new__(_Memoized)
    fast.__dict__.update(model.__dict__)  # the same parameters, buffers and submodules
    fast.__dict__["_memo"] = {}
    fast.__dict__["_params"] = tuple(model.parameters()) + tuple(model.buffers())
    return fast
