"""A request and its state inside the serving engine. Built on the shared types only (:mod:`specdec.params`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields

import torch

from specdec.params import GREEDY, SamplingParams, StopCriteria


class SeqStatus(enum.Enum):
    """Where a request stands: queued (new or preempted), in the running batch, or done."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"  # the client went away: its blocks were freed, nothing more is emitted


@dataclass(eq=False)
class Seq:
    """One request: what was asked, and where it stands. Compared and hashed by identity.

    ``num_computed``: tokens whose K and V the target's cache holds (for a decoding row,
    every committed token but the last); ``draft_computed``: the same for the draft.
    ``lookahead``: drafts this row wants in the next step (0: plain decoding).
    ``cached_blocks``: leading blocks of the table already shared through the prefix cache (taken from it
    on a hit, or published by this row).
    Times are ``time.perf_counter()`` readings.
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
    cached_blocks: int = 0
    status: SeqStatus = SeqStatus.WAITING
    generator: torch.Generator | None = field(default=None, repr=False)
    # measurements
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None
    proposed: int = 0  # drafts proposed and accepted over the request's verify rounds
    accepted: int = 0
    rejections: int = 0  # verify rounds that ended by a rejection (accepted fewer than proposed)
    preemptions: int = 0

    def __repr__(self) -> str:  # short, for schedules and error messages: Seq#3
        return f"Seq#{self.seq_id}"

    def snapshot(self) -> tuple[dict, torch.Tensor | None]:
        """Everything a step can change, to put back with :meth:`restore` if the step fails."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "generator"}
        values["output"], values["block_table"] = list(self.output), list(self.block_table)
        return values, self.generator.get_state() if self.generator is not None else None

    def restore(self, snapshot: tuple[dict, torch.Tensor | None]) -> None:
        values, generator_state = snapshot
        for name, value in values.items():
            setattr(self, name, list(value) if isinstance(value, list) else value)
        if generator_state is not None:
            self.generator.set_state(generator_state)

    @property
    def num_tokens(self) -> int:
        """Prompt and output: the tokens the request knows."""
        return len(self.prompt) + len(self.output)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    @property
    def draft_acceptance_rate(self) -> float | None:
        """accepted / proposed (not alpha: see :mod:`specdec.metrics`)."""
        return self.accepted / self.proposed if self.proposed else None
