"""What a request asks for, shared by every loop: how to sample, when to stop, and the checks that a
request can be served. Imports no loop, so engines, proposers and the serving engine all build on it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.models.model import Llama
from specdec.sampling import probs_from_logits
from specdec.validate import check_positive_int


@dataclass(frozen=True)
class SamplingParams:
    """Applied identically to draft and target: temperature 0 is greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V) logits -> the float64 distribution a token is drawn from (one-hot when greedy)."""
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p)


GREEDY = SamplingParams()


def check_vocabularies(target, draft) -> None:
    """A draft token id must mean what it means to the target: one tokenizer, so one vocabulary.

    Compares the logits' widths and, where both configs carry one (:mod:`specdec.models.pretrained`), a
    fingerprint of the tokenizer's id -> token map."""
    t, d = target.config, draft.config
    advice = ("Speculative decoding as written here needs one shared tokenizer: take the draft from the target's "
              "family. For a pair that does not share one, transformers' Universal Assisted Generation translates "
              "the drafts through text: generate(..., assistant_model=draft, tokenizer=target_tokenizer, "
              "assistant_tokenizer=draft_tokenizer).")
    fingerprints = getattr(t, "vocab_fingerprint", None), getattr(d, "vocab_fingerprint", None)
    if d.vocab_size != t.vocab_size:
        if None not in fingerprints and fingerprints[0] == fingerprints[1]:
            advice = ("Both use the same tokenizer, so only the LM heads' padding differs: "
                      "specdec.models.pretrained.share_vocabulary(target, draft) cuts both to the common width.")
        raise ValueError(f"draft and target vocabularies differ: the draft scores {d.vocab_size} token ids, the target "
                         f"{t.vocab_size}. {advice}")
    if None not in fingerprints and fingerprints[0] != fingerprints[1]:
        raise ValueError(f"draft and target vocabularies differ: both score {t.vocab_size} token ids, but their "
                         f"tokenizers map ids to different tokens. {advice}")


def check_request(target: Llama, draft: Llama | None, prompt: list[int], n_tokens: int, gamma: int) -> None:
    """Clear errors for a request the models cannot serve."""
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ValueError("the prompt must be a non-empty list of token ids")
    check_positive_int(n_tokens, "n_tokens")
    if draft is not None:
        check_positive_int(gamma, "gamma")
        check_vocabularies(target, draft)
    V = target.config.vocab_size
    if min(prompt) < 0 or max(prompt) >= V:
        raise ValueError(f"prompt token ids must lie in [0, {V}), got min {min(prompt)} and max {max(prompt)}")
    needed = len(prompt) + n_tokens + gamma + 1
    for name, model in (("target", target), ("draft", draft)):
        if model is not None and needed > model.config.max_seq_len:
            raise ValueError(
                f"prompt ({len(prompt)}) + n_tokens ({n_tokens}) + gamma + 1 ({gamma + 1}) = {needed} positions "
                f"exceed the {name}'s context of {model.config.max_seq_len}"
            )


@dataclass(frozen=True)
class StopCriteria:
    """When a request ends: at its max_tokens-th new token, at a stop token, or at the token that
    completes a stop sequence (token ids: a stop string, encoded). Only new tokens count, never the
    prompt. The token that ends the request is part of the output."""

    max_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        check_positive_int(self.max_tokens, "max_tokens")
        if any(not seq for seq in self.stop_sequences):
            raise ValueError(f"every stop sequence needs at least one token, got {self.stop_sequences}")


def accept_until_stop(output: list[int], committed: list[int], stop: StopCriteria) -> tuple[list[int], bool]:
    """The part of a round's committed tokens to emit, and whether the request is finished.

    ``output``: the new tokens emitted in earlier rounds; ``committed``: this round's. The
    tokens are taken in order; the first one that is the max_tokens-th new token, a stop
    token, or the end of a stop sequence (which may begin in an earlier round) is the last
    one emitted.
    """
    if len(output) >= stop.max_tokens:
        raise ValueError(f"the request already has {len(output)} >= max_tokens = {stop.max_tokens} tokens")
    ### BEGIN SOLUTION
    text = list(output)
    for i, token in enumerate(committed):
        text.append(token)
        if (len(text) == stop.max_tokens or token in stop.stop_token_ids
                or any(text[-len(seq):] == list(seq) for seq in stop.stop_sequences)):
            return list(committed[: i + 1]), True
    return list(committed), False
    ### END SOLUTION
