"""Toy language models for notebooks 02-04: next-token logits from the last two tokens.

Small enough to enumerate, deterministic, and shaped like a transformer forward: given
a sequence of T tokens, ``logits`` returns T rows, row i scoring the token that follows
tokens[: i + 1].
"""

from __future__ import annotations

import torch

from specdec.sampling import probs_from_logits, sample
from specdec.validate import check_positive_int, check_token_ids


class ToyLM:
    """Logits of the next token given the previous two: a (V, V, V) table of float64."""

    def __init__(self, vocab_size: int, seed: int = 0, scale: float = 3.0) -> None:
        check_positive_int(vocab_size, "vocab_size", minimum=2)
        g = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.table = scale * torch.randn(vocab_size, vocab_size, vocab_size, generator=g, dtype=torch.float64)

    def noisy_copy(self, noise: float, seed: int = 1) -> ToyLM:
        """A draft: the same table plus Gaussian noise (noise = 0 gives a perfect draft)."""
        g = torch.Generator().manual_seed(seed)
        draft = ToyLM.__new__(ToyLM)
        draft.vocab_size = self.vocab_size
        draft.table = self.table + noise * torch.randn(self.table.shape, generator=g, dtype=torch.float64)
        return draft

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """(T,) token ids -> (T, V): row i scores the token after tokens[: i + 1]."""
        check_token_ids(tokens, "tokens", self.vocab_size, ndim=1)
        previous = torch.cat([tokens[:1], tokens[:-1]])  # position 0 sees itself twice
        return self.table[previous, tokens]

    def next_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """(T,) -> (V,): logits of the token after the whole sequence."""
        return self.logits(tokens[-2:])[-1]


def greedy_generate(model: ToyLM, prompt: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Plain greedy decoding: n_tokens new ids after the prompt -> (n_tokens,)."""
    tokens = prompt.clone()
    for _ in range(n_tokens):
        tokens = torch.cat([tokens, model.next_logits(tokens).argmax().view(1)])
    return tokens[len(prompt):]


def sample_generate(
    model: ToyLM, prompt: torch.Tensor, n_tokens: int, temperature: float, generator: torch.Generator
) -> torch.Tensor:
    """Plain sampling: n_tokens new ids after the prompt -> (n_tokens,)."""
    tokens = prompt.clone()
    for _ in range(n_tokens):
        probs = probs_from_logits(model.next_logits(tokens), temperature)
        tokens = torch.cat([tokens, sample(probs, generator).view(1)])
    return tokens[len(prompt):]
