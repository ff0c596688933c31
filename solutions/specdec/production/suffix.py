"""Suffix decoding (Oliaro et al., "SuffixDecoding", NeurIPS 2025; Snowflake's Arctic Inference): drafts from
a suffix tree over text the system has already seen, with no draft model.

The tree holds every substring of up to ``depth`` tokens of the documents inserted into it (a request's
prompt and output, and earlier requests' too), each node counting how often its substring occurred.
To propose, find the longest suffix of the current tokens that the tree holds (the **match**), then walk
down from it, always to the most frequent child, while the walk's estimated probability (the product of
child count / parent count) stays at or above ``min_prob`` and the draft is shorter than
``factor * match length`` (a long match earns a long draft; no match, no draft). Documents never run into
each other: a substring that crosses from one request into the next is never inserted.

Prompt lookup (notebook 06) is the special case with one document, the latest match and no counts.
The drafts are deterministic, so they are verified as one-hot drafts (notebook 03's rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specdec.chain import verify_drafts
from specdec.models.model import KVCache, Llama
from specdec.params import GREEDY, SamplingParams, check_request


@dataclass
class Node:
    count: int = 0
    children: dict[int, Node] = field(default_factory=dict)


class SuffixTree:
    """A count-annotated trie of every substring of at most ``depth`` tokens of the inserted documents."""

    def __init__(self, depth: int = 32) -> None:
        if not isinstance(depth, int) or depth < 2:
            raise ValueError(f"depth must be an int >= 2, got {depth!r}")
        self.depth, self.root = depth, Node()
        self._open: dict[object, list[Node]] = {}  # per document: the nodes of the substrings ending at its end

    def extend(self, doc: object, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to document ``doc`` (started on first use): each new token adds the substrings of
        up to ``depth`` tokens that end at it, by extending those that ended at the token before."""
        for token in tokens:
            ends = self._open.get(doc, [])[-(self.depth - 1):]  # substrings ending at the last token, longest first
            grown = []
            for node in ends + [self.root]:
                child = node.children.setdefault(int(token), Node())
                child.count += 1
                grown.append(child)
            self._open[doc] = grown
            self.root.count += 1

    def longest_match(self, tokens: Sequence[int]) -> tuple[int, Node | None]:
        """The longest suffix of ``tokens`` (at most depth - 1 tokens) that the tree holds: (length, node)."""
        tail = list(tokens[-(self.depth - 1):])
        for start in range(len(tail)):
            node = self.root
            for t in tail[start:]:
                node = node.children.get(t)
                if node is None:
                    break
            else:
                return len(tail) - start, node
        return 0, None


def propose_from_tree(tree: SuffixTree, tokens: Sequence[int], max_drafts: int, factor: float = 1.0,
                      min_prob: float = 0.1) -> tuple[list[int], float]:
    """Suffix decoding's proposal: (drafts, their estimated probability; 0.0 with no drafts).

    Match the longest suffix of ``tokens`` the tree holds (``tree.longest_match``), then walk down from its
    node, each step to the child with the highest count (ties to the lower token id), multiplying the
    estimate by child count / parent count, and stop before the estimate would fall below ``min_prob``,
    at a leaf, or at ``min(max_drafts, int(factor * match length))`` drafts."""
    ### BEGIN SOLUTION
    length, node = tree.longest_match(tokens)
    drafts, prob = [], 1.0
    limit = min(max_drafts, int(factor * length))
    while node is not None and node.children and len(drafts) < limit:
        token, child = max(node.children.items(), key=lambda item: (item[1].count, -item[0]))
        if prob * child.count / node.count < min_prob:
            break
        prob *= child.count / node.count
        drafts.append(token)
        node = child
    return drafts, prob if drafts else 0.0
    ### END SOLUTION


class SuffixProposer:
    """Per-request trees beside one global tree over earlier requests; the higher-scoring proposal wins.

    Only committed tokens go in (a rejected draft is never inserted), and each request is its own document."""

    def __init__(self, depth: int = 32, factor: float = 1.0, min_prob: float = 0.1) -> None:
        self.depth, self.factor, self.min_prob = depth, factor, min_prob
        self.global_tree = SuffixTree(depth)
        self.requests: dict[object, SuffixTree] = {}

    def start(self, request: object, prompt: Sequence[int]) -> None:
        tree = self.requests[request] = SuffixTree(self.depth)
        tree.extend(request, prompt)

    def commit(self, request: object, tokens: Sequence[int]) -> None:
        """Tokens the target committed for ``request``: they extend its own tree."""
        self.requests[request].extend(request, tokens)

    def finish(self, request: object, tokens: Sequence[int]) -> None:
        """The request ended with ``tokens`` (prompt and output): later requests may draft from them."""
        self.global_tree.extend(request, tokens)
        del self.requests[request]

    def propose(self, request: object, tokens: Sequence[int], max_drafts: int) -> list[int]:
        own = propose_from_tree(self.requests[request], tokens, max_drafts, self.factor, self.min_prob)
        shared = propose_from_tree(self.global_tree, tokens, max_drafts, self.factor, self.min_prob)
        best = max((own, shared), key=lambda proposal: len(proposal[0]) * proposal[1])
        return best[0]


@torch.inference_mode()
def proposer_generate(target: Llama, prompt: list[int], n_tokens: int, propose: Callable[[list[int]], list[int]],
                      params: SamplingParams = GREEDY, generator: torch.Generator | None = None,
                      on_commit: Callable[[list[int]], None] | None = None) -> list[int]:
    """n_tokens new tokens, distributed as target-only decoding's, with drafts from ``propose(tokens)`` (any
    deterministic proposer: suffix decoding, prompt lookup) verified as one-hot drafts; ``on_commit(tokens)``
    sees each round's committed tokens (to extend a suffix tree, say)."""
    check_request(target, None, prompt, n_tokens, 1)
    cache, tokens = KVCache(target.config), list(prompt)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
    while len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        room = min(n_tokens - (P - len(prompt)) - 1, target.config.max_seq_len - P)
        drafts = list(propose(tokens))[: max(room, 0)]
        logits = target(torch.tensor([tokens[-1:] + drafts]), cache)[0]  # (len(drafts) + 1, V)
        q = torch.nn.functional.one_hot(torch.tensor(drafts, dtype=torch.long, device=logits.device),
                                        logits.shape[-1]).to(torch.float64)
        committed = verify_drafts(drafts, q, logits, params, generator)
        tokens += committed
        cache.crop(P + len(committed) - 1)
        if on_commit is not None:
            on_commit(committed)
    return tokens[len(prompt) : len(prompt) + n_tokens]
