"""Notebook 13, prefix caching with speculation: requests that share a prefix share its KV blocks.

A block is **published** (its KV made reusable) once it is full of tokens whose K and V the
target's cache holds: verified tokens only, ``num_computed // block_size`` blocks of a row.
Lookahead slots lie past ``num_computed``, so a block that a rejection left half-written is
never published ("we only cache the verified tokens", vLLM V1's ``kv_cache_manager.py``).
A later request whose prompt starts with the same full blocks **hits**: its table starts
with those blocks (their reference counts go up) and its prefill starts after them. At
least one prompt token is always computed, since its logits give the first new token.
The engine takes a hit's blocks only when it admits the request and has room for the rest
of its tokens; a waiting request holds nothing (vLLM's ``allocate_slots`` checks the free
blocks before it touches the cached ones).

A block's key is the whole prefix up to its end, so two different prefixes can never share
a key (vLLM hashes a block's tokens together with its parent block's hash instead).
A published block whose last reference goes away stays cached until its slot is handed
out again (least recently freed first). Only the target's KV is shared in this sense: a
hit row's draft recomputes the prefix (writing the same prefix's values into the shared
blocks' draft slots), which changes proposals at most, never what verification commits.
"""

from __future__ import annotations

from collections.abc import Sequence


def prefix_key(tokens: Sequence[int], block: int, block_size: int) -> tuple[int, ...]:
    """The cache key of full block ``block`` of a request: every token from position 0 to the block's end."""
    return tuple(tokens[: (block + 1) * block_size])


class PrefixCache:
    """Published blocks by prefix, and each block's prefix: the two sides of one map."""

    def __init__(self) -> None:
        self.block_of: dict[tuple[int, ...], int] = {}
        self.key_of: dict[int, tuple[int, ...]] = {}
        # prompt tokens looked up and how many of them hit (the hit rate's two sides), counted by the engine once
        # per admitted request (again after a preemption), not once per step it waits
        self.queried_tokens = 0
        self.hit_tokens = 0

    def __contains__(self, block: int) -> bool:
        return block in self.key_of

    @property
    def hit_rate(self) -> float:
        """Hit tokens over looked-up prompt tokens, as vLLM's prefix cache metrics count it."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def add(self, key: tuple[int, ...], block: int) -> None:
        """Publish ``block`` under ``key``; a prefix or a block already published keeps its entry."""
        if key not in self.block_of and block not in self.key_of:
            self.block_of[key] = block
            self.key_of[block] = key

    def evict(self, block: int) -> None:
        """Forget a block that is being handed out for other tokens."""
        key = self.key_of.pop(block, None)
        if key is not None:
            del self.block_of[key]

    def state(self) -> tuple:
        return dict(self.block_of), dict(self.key_of), self.queried_tokens, self.hit_tokens

    def restore(self, state: tuple) -> None:
        block_of, key_of, self.queried_tokens, self.hit_tokens = state
        self.block_of, self.key_of = dict(block_of), dict(key_of)


def match_prefix(cache: PrefixCache, tokens: Sequence[int], block_size: int) -> list[int]:
    """The published blocks that hold ``tokens``' longest prefix of whole blocks, in order, leaving at
    least the last token to compute (its logits give the first new token)."""
    ### BEGIN SOLUTION
    blocks: list[int] = []
    while (len(blocks) + 1) * block_size <= len(tokens) - 1:
        block = cache.block_of.get(prefix_key(tokens, len(blocks), block_size))
        if block is None:
            break
        blocks.append(block)
    return blocks
    ### END SOLUTION


def publish_blocks(cache: PrefixCache, tokens: Sequence[int], block_table: Sequence[int], num_computed: int,
                   block_size: int, start: int = 0) -> int:
    """Publish a row's full blocks of verified tokens (the first ``num_computed`` positions, whose K and V the
    cache holds), from block ``start`` on, with :meth:`PrefixCache.add`; returns the row's new ``start``: how
    many of its blocks have been considered."""
    ### BEGIN SOLUTION
    full = num_computed // block_size
    for i in range(start, full):
        cache.add(prefix_key(tokens, i, block_size), block_table[i])
    return max(full, start)
    ### END SOLUTION
