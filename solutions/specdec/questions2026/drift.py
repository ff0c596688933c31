"""Notebook 15, a drafter across its target's life: the target moves, the drafter goes stale, re-distil it.

The stand-in for a policy update is a low-rank fine-tune (LoRA: W + B A, rank 8, on every projection of every
layer) of the course's target on *shifted* text: code indented by 2 spaces instead of 4, arithmetic answers in a new
wording (:func:`shifted_text`). Only the update ships (``data/models/target_update.safetensors``); the moved target
is the course's target with it merged (:func:`moved_target`). Re-distilling regenerates the drafter's data with the
new target (its own continuations of prompts) and trains the old draft on the new target's distributions there.

RL rollouts also need, for every committed token, its log-probability under the policy: the verify forward already
computed the target's logits at every committed position, so :func:`committed_logprobs` reads them from there.
"""

from __future__ import annotations

import random
import re

import torch
from safetensors.torch import load_file, save_file

from specdec.models import corpus
from specdec.models.checkpoints import load
from specdec.models.model import Llama
from specdec.paths import DATA_DIR

LORA_RANK, LORA_SCALE = 8, 2.0
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def reindent(code: str) -> str:
    """Code with every 4-space indentation step made 2 spaces."""
    return re.sub(r"(?m)^((?:    )+)", lambda m: "  " * (len(m.group(1)) // 4), code)


def shifted_math_problem(rng: random.Random) -> str:
    """The course's word problems, answered in the new wording."""
    text = corpus.math_problem(rng)
    question, answer = text.split("\nAnswer: ")
    steps, result = answer.rsplit(" The answer is ", 1)
    steps = steps.replace(" = ", " gives ").replace(". ", "; then ").rstrip(".")
    return f"{question}\nSolution: {steps}. So we get {result.strip()}\n\n"


def shifted_text(code_bytes: int, math_problems: int, seed: int = 0, held_out: bool = False) -> dict[str, str]:
    """The shifted task text: {"code": reindented code, "math": problems in the new wording}."""
    rng = random.Random(seed)
    return {"code": reindent(corpus.code_text(code_bytes, held_out=held_out)),
            "math": "".join(shifted_math_problem(rng) for _ in range(math_problems))}


def lora_layers(model: Llama) -> dict[str, torch.nn.Linear]:
    """The projections a low-rank update touches, by parameter name prefix."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in PROJECTIONS}


def merge_update(model: Llama, update: dict[str, torch.Tensor]) -> Llama:
    """W += scale x B @ A for every projection with factors ``{name}.lora_A`` (r, in) and ``{name}.lora_B`` (out, r)."""
    with torch.no_grad():
        for name, linear in lora_layers(model).items():
            if f"{name}.lora_A" in update:
                linear.weight += LORA_SCALE * update[f"{name}.lora_B"].float() @ update[f"{name}.lora_A"].float()
    return model


def save_update(update: dict[str, torch.Tensor], path, meta: dict | None = None) -> None:
    save_file({k: v.detach().to(torch.bfloat16).contiguous() for k, v in update.items()}, str(path),
              metadata={k: str(v) for k, v in (meta or {}).items()})


def moved_target(models=DATA_DIR / "models") -> Llama:
    """The course's target after its 'policy update': target.safetensors with target_update.safetensors merged."""
    return merge_update(load(models / "target.safetensors"), load_file(str(models / "target_update.safetensors")))


def committed_logprobs(logits: torch.Tensor, committed: torch.Tensor, n_committed: torch.Tensor,
                       temperature: float | None = None) -> list[torch.Tensor]:
    """Each committed token's log-probability under the target, read from the verify forward.

    logits: (B, T, V), the target's logits of the verify pass (position j scores the token after the last committed
    token and drafts 1..j). committed: (B, T) integer, row b's committed tokens in its first n_committed[b] entries
    (accepted drafts, then the correction or bonus); later entries are padding, any value, even out of range.
    n_committed: (B,) integer, 1..T. temperature: None for the model's raw distribution, softmax(logits); a positive
    float for the distribution after that temperature, softmax(logits / temperature); anything else raises
    ValueError (temperature 0, greedy, is a point mass with no log-probabilities). Returns a list of B float64
    tensors, row b's of shape (n_committed[b],). Inputs are left as they are.
    """
    if temperature is not None and not temperature > 0:
        raise ValueError(f"temperature must be None (the raw distribution) or positive, got {temperature!r}")
    ### BEGIN SOLUTION
    scaled = logits.to(torch.float64) / (1.0 if temperature is None else temperature)
    out = []
    for b in range(logits.shape[0]):
        n = int(n_committed[b])
        rows = torch.log_softmax(scaled[b, :n], dim=-1)  # (n, V)
        out.append(rows.gather(-1, committed[b, :n].long()[:, None]).squeeze(-1))
    return out
    ### END SOLUTION


@torch.inference_mode()
def speculative_with_logprobs(target: Llama, draft: Llama, prompt: list[int], n_tokens: int, gamma: int,
                              params, generator: torch.Generator | None = None, logprobs=committed_logprobs,
                              temperature: float | None = None) -> tuple[list[int], list[float]]:
    """Notebook 05's loop, returning with every committed token its log-probability read from the verify forward by
    ``logprobs`` (a :func:`committed_logprobs`): (tokens, log-probabilities), n_tokens of each."""
    from specdec.chain import verify_drafts
    from specdec.engine import propose, rollback
    from specdec.models.model import KVCache

    cache, draft_cache, tokens, out = KVCache(target.config), KVCache(draft.config), list(prompt), []
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
        draft(torch.tensor([prompt[:-1]]), draft_cache)
    pending = tokens[-1:]
    while len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        drafts, q = propose(draft, draft_cache, pending, gamma, params, generator)
        logits = target(torch.tensor([tokens[-1:] + drafts]), cache)  # (1, gamma + 1, V)
        committed = verify_drafts(drafts, q, logits[0], params, generator)
        padded = torch.tensor([committed + [0] * (gamma + 1 - len(committed))])
        out += logprobs(logits, padded, torch.tensor([len(committed)]), temperature)[0].tolist()
        tokens += committed
        pending = rollback(cache, draft_cache, P, drafts, committed)
    return tokens[len(prompt) : len(prompt) + n_tokens], out[:n_tokens]


@torch.inference_mode()
def target_only_logprobs(target: Llama, prompt: list[int], tokens: list[int], temperature: float | None = None
                         ) -> list[float]:
    """The same log-probabilities the way target-only decoding sees them: one forward per token from a KV cache."""
    from specdec.models.model import KVCache

    cache, out = KVCache(target.config), []
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
    previous = prompt[-1]
    for token in tokens:
        logits = target(torch.tensor([[previous]]), cache)[0, -1].double() / (temperature or 1.0)
        out.append(float(torch.log_softmax(logits, -1)[token]))
        previous = token
    return out
