"""A request and its state inside the serving engine (imports nothing of the engine)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.engine import GREEDY, SamplingParams, StopCriteria


@dataclass(eq=False)
class Seq:
    """One request: what was asked, and where it stands.

    ``num_computed``: tokens whose K and V the target's cache holds (for a decoding row,
    every committed token but the last); ``draft_computed``: the same for the draft.
    ``lookahead``: drafts this row wants in the next step (0: plain decoding).
    """

    seq_id: int
    prompt: list[int]
    stop: StopCriteria
    params: SamplingParams = GREEDY
    gamma: int | str = 0  # drafts per step: an int (0 = no speculation) or "auto"
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    draft_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    lookahead: int = 0
    finished: bool = False
    generator: torch.Generator | None = field(default=None, repr=False)
    # measurements
    arrival_s: float = 0.0
    first_token_s: float | None = None
    finish_s: float | None = None
    proposed: int = 0
    accepted: int = 0
    preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        """Prompt and output: the tokens the request knows."""
        return len(self.prompt) + len(self.output)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None
