"""A continuous-batching engine with speculative decoding, on the course's Llama models.

Each :meth:`ServingEngine.step`:

1. picks each decoding row's lookahead (its gamma, or :func:`choose_gamma` for "auto" rows);
2. schedules under the token budget and the free blocks (:func:`schedule_step`), preempting
   if it must, and reserves every scheduled row's slots, lookahead included (:func:`reserve_slots`);
   with prefix caching, a waiting request's hit is shown to the scheduler but taken only when the
   request is admitted and its other blocks fit (a waiting request holds nothing);
3. drafts: the draft feeds each speculating row's pending tokens, then one token per row
   per draft position, all rows in one forward each (ragged);
4. verifies: one target forward over every scheduled row at once (prefill chunks, plain
   decode rows and ``1 + gamma`` verify positions side by side) and verifies each
   speculating row with notebook 02's or 04's verifier, with that row's settings;
5. commits each row's own count, ending rows at stops inside the drafts (:func:`commit_round`),
   and gives back every block the row no longer needs (:func:`release_slots`).

Every tensor of a step lives on the models' device (the paged caches, the index tensors, each request's
generator), and every clock read first waits for that device.

Each request samples from its own seeded generator, so its output *distribution* does not depend
on which other requests shared its batches (the draws themselves can: the batch decides how many
drafts a row makes under the token budget or with gamma="auto"). The first step with a "auto" row
measures the forward costs if none were given (a few seconds).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch

from specdec.chain import verify_drafts
from specdec.models import tokenizer
from specdec.models.devices import model_device, synchronize
from specdec.models.model import Llama
from specdec.params import GREEDY, SamplingParams, StopCriteria, check_vocabularies
from specdec.sampling import sample
from specdec.serving.adaptive import BatchCosts, GoodputGate, StepCosts, choose_gamma, smoothed_alpha
from specdec.serving.blocks import blocks_for, release_slots, reserve_slots, slot_mapping
from specdec.serving.commit import commit_round
from specdec.serving.paged import PagedKV, RaggedBatch, paged_forward
from specdec.serving.prefix_cache import PrefixCache, match_prefix, prefix_key, publish_blocks
from specdec.serving.scheduler import schedule_step
from specdec.serving.sequence import Seq, SeqStatus
from specdec.validate import check_positive_int

AUTO_DECAY = 0.99  # old acceptance evidence fades: about 100 steps
OVERHEAD_WINDOW = 16  # the per-step overheads are medians over this many recent steps
AUTO_PROBE_BELOW = 8.0  # with fewer recently tested draft positions than this, "auto" drafts at least one token (explores)


@dataclass(frozen=True)
class Parts:
    """The exercises' functions the engine calls: the reference's, or yours, for example
    ``Parts(commit_round=my_commit_round, schedule_step=my_schedule_step)``."""

    reserve_slots: Callable[[list[int], list[int], int, int], bool] = reserve_slots
    release_slots: Callable[[list[int], list[int], int, int], None] = release_slots
    slot_mapping: Callable[[list[list[int]], list[int], list[int], int], torch.Tensor] = slot_mapping
    commit_round: Callable[[list[Seq], list[list[int]], list[int]], list[list[int]]] = commit_round
    schedule_step: Callable[[list[Seq], list[Seq], int, int, int], tuple[dict[Seq, int], list[Seq]]] = schedule_step
    choose_gamma: Callable[..., int] = choose_gamma
    match_prefix: Callable[[PrefixCache, list[int], int], list[int]] = match_prefix
    publish_blocks: Callable[[PrefixCache, list[int], list[int], int, int, int], int] = publish_blocks

    def __post_init__(self) -> None:
        for f in fields(self):
            if not callable(getattr(self, f.name)):
                raise TypeError(f"Parts.{f.name} must be a function, got {getattr(self, f.name)!r}")


class StepError(RuntimeError):
    """A step failed (in one of the parts, or a model); the engine is as it was before the step."""


@dataclass
class StepRecord:
    """What one step did, for plots and the benchmark."""

    seconds: float
    target_tokens: int  # tokens in the target's forward
    rows: int
    decoding_rows: int
    speculating_rows: int
    max_gamma: int  # the largest number of drafts a row verified
    drafts: int  # drafts verified in the step, all rows together
    free_blocks: int


class ServingEngine:
    """Continuous batching with paged KV and per-request speculation. Not thread-safe."""

    def __init__(self, target: Llama, draft: Llama | None = None, *, num_blocks: int = 512, block_size: int = 16,
                 token_budget: int = 512, max_gamma: int = 8,
                 costs: tuple[BatchCosts | StepCosts, BatchCosts | StepCosts] | None = None,
                 parts: Parts = Parts(), measure_gain: bool = True, prefix_caching: bool = False,
                 gate: GoodputGate | None = None) -> None:
        """``parts``: the exercises' functions to use (:class:`Parts`; the reference's by default).
        ``prefix_caching``: share the KV blocks of verified prefixes between requests (:mod:`.prefix_cache`).
        ``measure_gain``: let "auto" overrule the cost model with the gain it measures (:class:`GoodputGate`) and
        add the time it measures outside the forwards; False keeps the model with the given costs alone, nothing
        from this machine's clock (for what-if costs that are not this machine's, and runs that must not depend
        on the machine). ``gate``: a gate an earlier engine of the same target and draft used, to go on from what
        it measured (a long-lived server's gate; a new one by default)."""
        if gate is not None and not measure_gain:
            raise ValueError("a gate is given but measure_gain=False: the engine would not use it")
        check_positive_int(num_blocks, "num_blocks")
        check_positive_int(block_size, "block_size")
        check_positive_int(token_budget, "token_budget")
        check_positive_int(max_gamma, "max_gamma", minimum=0)
        self.device = model_device(target)  # where the caches live, the forwards run and the requests sample
        if draft is not None:
            check_vocabularies(target, draft)
            if model_device(draft) != self.device:
                raise ValueError(f"the target is on {self.device} and the draft on {model_device(draft)}: the engine "
                                 "verifies the draft's distributions against the target's, so put both on one device")
        self.target, self.draft = target.eval(), draft.eval() if draft is not None else None
        dtype = next(target.parameters()).dtype
        self.kv = PagedKV(target.config, num_blocks, block_size, dtype, self.device)
        self.draft_kv = PagedKV(draft.config, num_blocks, block_size, dtype, self.device) if draft is not None else None
        self.num_blocks, self.block_size, self.token_budget, self.max_gamma = num_blocks, block_size, token_budget, max_gamma
        self.free_blocks = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self.refs: dict[int, int] = {}  # block -> how many block tables hold it (more than one: a shared prefix)
        self.prefix_cache = PrefixCache() if prefix_caching else None
        self.waiting: list[Seq] = []
        self.running: list[Seq] = []
        self.done: dict[int, Seq] = {}
        self.steps: list[StepRecord] = []
        self.costs = tuple(c if isinstance(c, BatchCosts) else BatchCosts.from_token_costs(c) for c in costs) if costs else None
        if not isinstance(parts, Parts):
            raise TypeError(f"parts must be a Parts, for example Parts(commit_round=commit_round), got {type(parts).__name__}")
        self.parts = parts
        self.last_step: dict = {}  # the last step's batch, for inspection
        self._draft_was_behind = False  # the last drafting step fed a catch-up (a row that drafted nothing for a while)
        # seconds outside the forwards per plain step, per verifying step, per draft forward: see _learn_overheads
        self._overhead_samples = {kind: deque(maxlen=OVERHEAD_WINDOW) for kind in ("plain_step", "verify_step", "draft_forward")}
        self.auto_evidence = (0.0, 0.0)  # "auto" rows' accepted drafts and tested positions, decayed by AUTO_DECAY per step
        self.gate = (gate or GoodputGate()) if measure_gain else None
        if gate is not None:
            gate.start_engine()
        self._auto_gamma = min(4, max_gamma)  # the model's last gamma > 0 for "auto" rows: what a probe drafts
        self._draft_first_s = 0.0  # the last drafting's first forward (which feeds each row's pending tokens)
        self._next_id = 0
        self._where: tuple[str, Seq | None] = ("the engine", None)  # what the step is doing, for its error
        self._in_step, self._overwritten = False, []
        self._aborting: list[int] = []  # aborts asked for during a step, carried out when it ends

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, prompt: Sequence[int] | str, max_tokens: int, params: SamplingParams = GREEDY, *,
                    stop: str | Sequence[str] = (), stop_token_ids: Sequence[int] = (), gamma: int | str = 0,
                    seed: int | None = None, arrival_time: float | None = None) -> int:
        """Queue a request; returns its id. Raises ValueError or TypeError, leaving the engine as it was,
        if the request is malformed or can never fit."""
        tokens = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        V, context = self.target.config.vocab_size, self.target.config.max_seq_len
        if not tokens:
            raise ValueError("the prompt is empty: give at least one token")
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < V for t in tokens):
            raise ValueError(f"prompt token ids must be ints in [0, {V})")
        check_positive_int(max_tokens, "max_tokens")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        params.probs(torch.zeros(1, V))  # raises on a bad temperature, top_k or top_p
        stop_sequences = _stop_sequences(stop)
        if isinstance(stop_token_ids, (str, bytes)) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < V for t in stop_token_ids):
            raise TypeError(f"stop_token_ids must be a sequence of token ids in [0, {V}), got {stop_token_ids!r}")
        if gamma != "auto":
            check_positive_int(gamma, "gamma", minimum=0)
            if gamma > self.max_gamma:
                raise ValueError(f"gamma={gamma} exceeds this engine's max_gamma={self.max_gamma}")
        if gamma != 0 and self.draft is None:
            raise ValueError(f"gamma={gamma!r} needs a draft model: this engine has none")
        if len(tokens) + max_tokens > context:
            raise ValueError(f"prompt ({len(tokens)} tokens) + max_tokens ({max_tokens}) = {len(tokens) + max_tokens} "
                             f"positions exceed the model's context of {context}")
        if blocks_for(len(tokens) + max_tokens, self.block_size) > self.num_blocks:
            raise ValueError(f"the request needs up to {blocks_for(len(tokens) + max_tokens, self.block_size)} blocks "
                             f"of {self.block_size} slots; the engine has {self.num_blocks} in all")
        seq = Seq(self._next_id, tokens, StopCriteria(max_tokens, tuple(stop_token_ids), stop_sequences), params, gamma,
                  generator=torch.Generator(device=self.device).manual_seed(seed if seed is not None else self._next_id),
                  arrival_time=time.perf_counter() if arrival_time is None else arrival_time)
        self._next_id += 1
        self.waiting.append(seq)
        return seq.seq_id

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def run(self) -> dict[int, Seq]:
        """Step until every request has finished or was aborted; every request ever added, by id."""
        while self.has_unfinished():
            self.step()
        return self.done

    def abort_request(self, seq_id: int) -> bool:
        """The client went away: free every block of the request (lookahead included) and emit nothing more
        for it; the other requests are unaffected. Asked for during a step (from a part, say), it takes effect
        when the step ends, even if the step fails and is undone, and drops what that step emitted for it (unless
        the step finished the request).
        False if the request had already ended."""
        seq = next((s for s in self.waiting + self.running if s.seq_id == seq_id), None)
        if seq is None:
            if seq_id in self.done:
                return False
            raise KeyError(f"no request {seq_id!r} in this engine (ids go from 0 to {self._next_id - 1})")
        if self._in_step:
            self._aborting.append(seq_id)
            return True
        self._release(seq, 0, by_part=False)
        (self.waiting if seq in self.waiting else self.running).remove(seq)
        seq.status, seq.num_computed, seq.draft_computed, seq.lookahead, seq.cached_blocks = SeqStatus.ABORTED, 0, 0, 0, 0
        seq.finish_time = time.perf_counter()
        self.done[seq.seq_id] = seq
        return True

    # ---- one step -------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> dict[int, list[int]]:
        """One scheduler step and one target forward; the tokens each request emitted. If anything in the step
        raises (a part, a model), the engine is put back exactly as it was before the step, and a
        :class:`StepError` names the part and the request(s)."""
        saved = self._save()
        self._in_step, self._aborting, self._overwritten = True, [], []
        try:
            emitted = self._step()
        except Exception as error:
            self._restore(saved)
            where, seq = self._where
            ids = [s.seq_id for s in self.running + self.waiting]
            who = f"request {seq.seq_id}" if seq is not None else "requests " + ", ".join(map(str, ids[:12])) + (
                ", ..." if len(ids) > 12 else "")
            self._abort_acknowledged()
            raise StepError(f"{where} raised {type(error).__name__}: {error} (step {len(self.steps)}, {who}); the "
                            "engine is as it was before the step (but for the aborts asked for during it, carried "
                            "out): fix it and call step() or run() again") from error
        except BaseException:  # an interrupt: put the engine back, let it through
            self._restore(saved)
            self._abort_acknowledged()
            raise
        finally:
            self._in_step = False
        for seq_id in self._aborting:  # the client left during the step: nothing of this step reaches it
            seq = next((s for s in self.running + self.waiting if s.seq_id == seq_id), None)
            if seq is not None:
                del seq.output[len(saved["seqs"][seq][0]["output"]):]
                emitted.pop(seq_id, None)
                self.abort_request(seq_id)
        return emitted

    def _abort_acknowledged(self) -> None:
        """After a failed step was rolled back: the aborts acknowledged during it are carried out all the same."""
        self._in_step = False
        for seq_id in self._aborting:
            if any(s.seq_id == seq_id for s in self.waiting + self.running):
                self.abort_request(seq_id)

    def _clock(self) -> float:
        """time.perf_counter() once the work queued on the device is done (a GPU runs its kernels after the launch)."""
        synchronize(self.device)
        return time.perf_counter()

    def _step(self) -> dict[int, list[int]]:
        start = self._clock()
        self._where = ("Parts.choose_gamma", None)
        self._set_lookahead()
        hits = self._match_prefixes()
        self._where = ("Parts.schedule_step", None)
        scheduled, preempted = self.parts.schedule_step(self.running, self.waiting, self.token_budget,
                                                        len(self.free_blocks), self.block_size)
        for seq in hits:  # the scheduler saw each waiting request's hit; until admitted it holds nothing
            seq.block_table, seq.num_computed, seq.cached_blocks = [], 0, 0
        self._preempt(preempted)
        short = False  # a preemption freed fewer blocks than the scheduler counted: a victim shared some
        for seq in [s for s in self.running if s in scheduled]:
            slots = seq.num_computed + scheduled[seq]
            if self.prefix_cache is not None and self._lacks(len(seq.block_table), slots) > len(self.free_blocks):
                self._preempt([seq])
                del scheduled[seq]
                short = True
                continue
            self._reserve(seq, slots)
        for seq in [s for s in self.waiting if s in scheduled]:  # in order: first come, first served
            if short or not self._admit(seq, hits.get(seq, []), scheduled[seq]):
                for later in [s for s in self.waiting if s in scheduled]:
                    del scheduled[later]
                break
        rows = [s for s in self.running if s in scheduled]
        if not rows:
            if self.running or self.waiting:
                raise RuntimeError("no request could be scheduled: the token budget or the KV blocks are too small")
            return {}
        gammas = [scheduled[s] - 1 if self._decoding(s) and s.lookahead else 0 for s in rows]
        decoding = sum(self._decoding(s) for s in rows)
        drafting = self._clock()
        self._where = ("the draft's forward", None)
        drafted_rows = [s for s, g in zip(rows, gammas) if g]
        drafts, qs = self._draft(drafted_rows, [g for g in gammas if g])
        drafted = self._clock()
        emitted = self._verify_and_commit(rows, gammas, scheduled, drafts, qs)
        self._where = ("the engine", None)
        end = self._clock()
        if decoding == len(rows) and self.gate is not None:  # the costs were measured on decode rows: learn there
            if len(drafted_rows) in (0, len(rows)):  # (a verify step's overhead grows with the rows it verifies)
                self._learn_overheads(drafted - drafting, max(gammas), len(drafted_rows),
                                      end - start - (drafted - drafting), len(rows),
                                      sum(scheduled.values()))
            if all(s.gamma == "auto" for s in rows):
                self._record_gain(len(rows), drafted_rows, max(gammas), drafted - drafting,
                                  end - start, sum(len(emitted.get(s.seq_id, ())) for s in drafted_rows))
        self.steps.append(StepRecord(end - start, sum(scheduled.values()), len(rows),
                                     decoding, len(drafted_rows), max(gammas), sum(gammas), len(self.free_blocks)))
        return emitted

    def _learn_overheads(self, draft_s: float, draft_forwards: int, draft_rows: int, other_s: float, rows: int,
                         tokens: int) -> None:
        """Time beyond the measured forward costs (Python, sampling, verification, bookkeeping) per target step
        and per draft forward, as medians of the last OVERHEAD_WINDOW decode-only steps (so at about the current
        batch size; a median, so that one slow step, a garbage collection say, does not move it): "auto" adds them
        to the forward costs, since a step saved by speculation saves them too. A step that verifies drafts costs
        more outside its forward than one that samples a token per row (each row's verification), so the two
        kinds are learned apart."""
        if self.costs is None:
            return
        extra = other_s - self.costs[0](rows, tokens / rows)
        self._overhead_samples["verify_step" if draft_forwards else "plain_step"].append(extra)
        if draft_forwards and not self._draft_was_behind:  # a catch-up forward is not the cost of drafting
            self._overhead_samples["draft_forward"].append(draft_s / draft_forwards - self.costs[1](draft_rows, 1))

    def _record_gain(self, rows: int, drafted: list[Seq], gamma: int, draft_s: float, step_s: float,
                     tokens: int) -> None:
        """Feed the gate one step of ``rows`` "auto" rows, of which ``drafted`` drafted and committed ``tokens``. A
        draft that fell behind while speculation was off first feeds every token it missed, once; the step is
        recorded as if that forward cost what its other forwards did (with one draft, what the measured costs say
        a draft forward costs)."""
        if gamma and self._draft_was_behind:  # a clean forward of this step stands in, or the measured costs
            clean = (draft_s - self._draft_first_s) / (gamma - 1) if gamma > 1 else (
                self.costs[1](len(drafted), 1) + self.overheads["draft_forward"])
            step_s -= self._draft_first_s - clean
        self.gate.record(len(self.steps), rows, gamma, step_s, tokens, smoothed_alpha(*self.auto_evidence),
                         drafting=len(drafted))

    @property
    def overheads(self) -> dict[str, float]:
        """Learned seconds outside the forwards: per plain step, per verifying step, per draft forward (>= 0)."""
        return {kind: max(statistics.median(samples), 0.0) if samples else 0.0
                for kind, samples in self._overhead_samples.items()}

    def _decoding(self, seq: Seq) -> bool:
        return seq.num_tokens - seq.num_computed == 1

    def _set_lookahead(self) -> None:
        self.auto_evidence = tuple(AUTO_DECAY * x for x in self.auto_evidence)
        decoding = [s for s in self.running if self._decoding(s)]
        auto = [s for s in decoding if s.gamma == "auto"]
        auto_gamma = 0
        if auto and self.max_gamma:
            costs = self.costs or self.measure_costs()
            accepted, tested = self.auto_evidence
            extra, B = self.overheads, len(decoding)
            verify = costs[0].at_batch(B)  # B rows of 1 + gamma tokens each

            def step_time(n: int) -> float:  # n == B: plain decoding, one token per row
                return verify(n) + extra["plain_step" if n <= B else "verify_step"]

            alpha = smoothed_alpha(accepted, tested)
            auto_gamma = self.parts.choose_gamma(alpha, B, step_time,
                                                    lambda n: costs[1](n, 1) + extra["draft_forward"], self.max_gamma)
            if tested < AUTO_PROBE_BELOW:  # too little recent evidence: draft one token to measure acceptance
                auto_gamma = max(auto_gamma, 1)
            self._auto_gamma = auto_gamma or self._auto_gamma
            if self.gate is not None and len(auto) == len(decoding) == len(self.running):
                # only where it measures: in a step that also prefills, speculation costs a smaller share
                auto_gamma, drafting = self.gate.decide(len(self.steps), B, alpha, auto_gamma, self._auto_gamma)
                if drafting < len(auto):  # a probe on a share of the rows: those the draft is closest to
                    auto = sorted(auto, key=lambda s: (s.num_tokens - s.draft_computed, s.seq_id))[:drafting]
        drafting_ids = {s.seq_id for s in auto}
        for seq in self.running:
            wanted = (auto_gamma if seq.seq_id in drafting_ids else 0) if seq.gamma == "auto" else int(seq.gamma)
            remaining = seq.stop.max_tokens - len(seq.output)  # never draft past max_tokens
            seq.lookahead = min(wanted, remaining - 1) if self._decoding(seq) else 0

    def _preempt(self, seqs: list[Seq]) -> None:
        for seq in seqs:
            if seq not in self.running:
                raise ValueError(f"it preempted {seq!r}, which is not running")
            self._release(seq, 0)
            seq.num_computed = seq.draft_computed = seq.lookahead = seq.cached_blocks = 0
            seq.status = SeqStatus.WAITING
            seq.preemptions += 1
            self.running.remove(seq)
            self.waiting.insert(0, seq)  # recomputed first, before any new request

    def _draft(self, rows: list[Seq], gammas: list[int]) -> tuple[dict[int, list[int]], dict[int, torch.Tensor]]:
        """gammas[b] proposals for each row: the first forward feeds each row's pending tokens."""
        drafts: dict[int, list[int]] = {s.seq_id: [] for s in rows}
        q_rows: dict[int, list[torch.Tensor]] = {s.seq_id: [] for s in rows}
        feeds = {s.seq_id: s.tokens[s.draft_computed:] for s in rows}
        self._draft_was_behind = max((len(f) for f in feeds.values()), default=0) > 2  # it fell behind while off
        started = self._clock()
        for j in range(max(gammas, default=0)):
            if j == 1:  # the first forward, which fed each row's pending tokens
                self._draft_first_s = self._clock() - started
            active = [s for s, g in zip(rows, gammas) if g > j]
            batch = RaggedBatch([feeds[s.seq_id] for s in active], [s.draft_computed for s in active],
                                [s.block_table for s in active])
            logits = paged_forward(self.draft, self.draft_kv, batch, [[len(feeds[s.seq_id]) - 1] for s in active],
                                   self._slot_mapping)
            for seq, q, token in zip(active, *_sample_rows(active, torch.cat(logits))):
                seq.draft_computed += len(feeds[seq.seq_id])
                drafts[seq.seq_id].append(token)
                q_rows[seq.seq_id].append(q)
                feeds[seq.seq_id] = [token]
        if max(gammas, default=0) == 1:
            self._draft_first_s = self._clock() - started
        return drafts, {k: torch.stack(v) for k, v in q_rows.items() if v}

    def _verify_and_commit(self, rows: list[Seq], gammas: list[int], scheduled: dict[Seq, int],
                           drafts: dict[int, list[int]], qs: dict[int, torch.Tensor]) -> dict[int, list[int]]:
        feeds, logit_rows = [], []
        for seq, gamma in zip(rows, gammas):
            if gamma:
                feeds.append(seq.tokens[-1:] + drafts[seq.seq_id])
                logit_rows.append(list(range(gamma + 1)))
            else:
                n = scheduled[seq]
                feeds.append(seq.tokens[seq.num_computed : seq.num_computed + n])
                logit_rows.append([n - 1] if seq.num_computed + n == seq.num_tokens else [])  # last chunk: sample
        batch = RaggedBatch(feeds, [s.num_computed for s in rows], [s.block_table for s in rows])
        self.last_step = {"seq_ids": [s.seq_id for s in rows], "batch": batch, "gammas": list(gammas)}
        self._where = ("the target's forward", None)
        logits = paged_forward(self.target, self.kv, batch, logit_rows, self._slot_mapping)
        committing, committed, committing_gammas = [], [], []
        for seq, gamma, row_logits, feed in zip(rows, gammas, logits, feeds):
            if not len(row_logits):  # a prefill chunk that is not the prompt's last
                seq.num_computed += len(feed)
                continue
            self._where = ("verification", seq)
            if gamma:
                tokens = verify_drafts(drafts[seq.seq_id], qs[seq.seq_id], row_logits, seq.params, seq.generator)
                k = len(tokens) - 1  # drafts accepted; a rejection (k < gamma) tested one position more
                seq.proposed, seq.accepted, seq.rejections = seq.proposed + gamma, seq.accepted + k, seq.rejections + (k < gamma)
                if seq.gamma == "auto":
                    accepted, tested = self.auto_evidence
                    self.auto_evidence = (accepted + k, tested + k + (k < gamma))
            else:
                tokens = [int(sample(seq.params.probs(row_logits[-1]), seq.generator))]
            committing.append(seq)
            committed.append(tokens)
            committing_gammas.append(gamma)
        self._where = ("Parts.commit_round", None)
        emitted_rows = self.parts.commit_round(committing, committed, committing_gammas)
        if not isinstance(emitted_rows, list) or len(emitted_rows) != len(committing):
            raise ValueError(f"it must return one list of emitted tokens per row ({len(committing)}), "
                             f"got {emitted_rows!r:.80}")
        self.last_step["emitted"] = {}
        now, emitted = self._clock(), self.last_step["emitted"]
        for seq, tokens in zip(committing, emitted_rows):
            emitted[seq.seq_id] = tokens
            if seq.first_token_time is None:
                seq.first_token_time = now
            self._publish(seq)
            if seq.is_finished:
                seq.finish_time = now
                self._release(seq, 0)
                self.running.remove(seq)
                self.done[seq.seq_id] = seq
            else:
                self._release(seq, seq.num_computed)
        return emitted

    # ---- blocks: reference counts and the prefix cache -----------------------------------------
    def _reserve(self, seq: Seq, num_slots: int) -> None:
        self._where = ("Parts.reserve_slots", seq)
        held = len(seq.block_table)
        if not self.parts.reserve_slots(self.free_blocks, seq.block_table, num_slots, self.block_size):
            raise ValueError(f"it refused {num_slots} slots that Parts.schedule_step granted "
                             f"({len(self.free_blocks)} blocks free, the table has {held})")
        for block in seq.block_table[held:]:
            if self.refs.get(block, 0):
                raise ValueError(f"it handed out block {block}, which another request holds")
            self.refs[block] = 1
            if self.prefix_cache is not None and block in self.prefix_cache:
                self.prefix_cache.evict(block)  # its slots now take other tokens
                self._overwritten.append(block)

    def _release(self, seq: Seq, num_kept: int, by_part: bool = True) -> None:
        """Give back the blocks of ``seq`` past ``num_kept`` slots: a block goes back to the free list when no
        table holds it any more, a published one to the front (handed out last, so it stays cached longest).
        ``by_part=False`` drops the whole table without Parts.release_slots: an abort must not fail."""
        self._where = ("Parts.release_slots", seq)
        released: list[int] = []
        if by_part:
            self.parts.release_slots(released, seq.block_table, num_kept, self.block_size)
        else:
            released, seq.block_table[:] = list(seq.block_table), []
        seq.cached_blocks = min(seq.cached_blocks, len(seq.block_table))
        for block in released:
            self.refs[block] -= 1
            if not self.refs[block]:
                del self.refs[block]
                if self.prefix_cache is not None and block in self.prefix_cache:
                    self.free_blocks.insert(0, block)
                else:
                    self.free_blocks.append(block)

    def _match_prefixes(self) -> dict[Seq, list[int]]:
        """Each waiting request without blocks, shown to the scheduler as if it started after the longest published
        prefix of its tokens (its table and ``num_computed`` set for the scheduler to read). Nothing is referenced:
        the blocks stay free and evictable until the request is admitted (:meth:`_admit`)."""
        hits: dict[Seq, list[int]] = {}
        if self.prefix_cache is None:
            return hits
        for seq in self.waiting:
            if seq.block_table:
                continue
            self._where = ("Parts.match_prefix", seq)
            hit = self.parts.match_prefix(self.prefix_cache, list(seq.tokens), self.block_size)
            if not isinstance(hit, list) or len(set(hit)) != len(hit) or any(b not in self.prefix_cache for b in hit):
                raise ValueError(f"it returned {hit!r}: not a list of distinct published blocks")
            if len(hit) * self.block_size > len(seq.tokens) - 1:
                raise ValueError(f"it matched {len(hit)} blocks for {len(seq.tokens)} tokens, leaving no token to "
                                 "compute (the last prompt token's logits give the first new token)")
            wanted = [self.prefix_cache.block_of.get(prefix_key(seq.tokens, i, self.block_size)) for i in range(len(hit))]
            if hit != wanted:
                raise ValueError(f"it returned blocks {hit} for a prefix published in blocks {wanted}")
            if hit:
                hits[seq] = hit
                seq.block_table, seq.cached_blocks = list(hit), len(hit)
                seq.num_computed = len(hit) * self.block_size
        return hits

    def _lacks(self, held: int, num_slots: int) -> int:
        """How many blocks a table of ``held`` blocks lacks for ``num_slots`` slots."""
        return max(blocks_for(num_slots, self.block_size) - held, 0)

    def _admit(self, seq: Seq, hit: list[int], num_tokens: int) -> bool:
        """Allocate a scheduled waiting request, vLLM's way: its hit (what is still published of it: running rows
        reserved first and may have taken a cached free block) is referenced only if the free list also holds the
        blocks for its ``num_tokens`` new tokens; otherwise it stays waiting and holds nothing. Counts the lookup
        in the cache's hit rate once per admission (the first, and each after a preemption)."""
        if self.prefix_cache is not None:
            hit = hit[:next((i for i, b in enumerate(hit) if b not in self.prefix_cache), len(hit))]
            taken = sum(b not in self.refs for b in hit)  # hit blocks that leave the free list
            if self._lacks(len(hit), len(hit) * self.block_size + num_tokens) + taken > len(self.free_blocks):
                return False
        seq.block_table = list(hit)
        for block in hit:
            if block not in self.refs:
                self.free_blocks.remove(block)
            self.refs[block] = self.refs.get(block, 0) + 1
        seq.cached_blocks, seq.num_computed = len(hit), len(hit) * self.block_size
        if self.prefix_cache is not None:
            self.prefix_cache.queried_tokens += len(seq.tokens)
            self.prefix_cache.hit_tokens += len(hit) * self.block_size
        self.waiting.remove(seq)
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        self._reserve(seq, seq.num_computed + num_tokens)
        return True

    def _publish(self, seq: Seq) -> None:
        if self.prefix_cache is not None:
            self._where = ("Parts.publish_blocks", seq)
            start = seq.cached_blocks
            done = self.parts.publish_blocks(self.prefix_cache, list(seq.tokens), list(seq.block_table),
                                             seq.num_computed, self.block_size, start)
            if not isinstance(done, int) or not start <= done <= len(seq.block_table):
                raise ValueError(f"it returned {done!r}, not a block count from {start} to {len(seq.block_table)}")
            seq.cached_blocks = done

    def _slot_mapping(self, *args) -> torch.Tensor:
        outer, self._where = self._where, ("Parts.slot_mapping", None)
        slots = self.parts.slot_mapping(*args)
        self._where = outer
        return slots

    # ---- a step that fails changes nothing -------------------------------------------------------
    def _save(self) -> dict:
        return {"lists": (list(self.waiting), list(self.running), dict(self.done), list(self.free_blocks),
                          dict(self.refs)),
                "steps": len(self.steps), "auto": (self.auto_evidence, self._auto_gamma, copy.deepcopy(self.gate)),
                "overheads": {kind: deque(samples, maxlen=OVERHEAD_WINDOW) for kind, samples in self._overhead_samples.items()},
                "draft": (self._draft_was_behind, self._draft_first_s), "last_step": self.last_step,
                "cache": self.prefix_cache.state() if self.prefix_cache is not None else None,
                "seqs": {seq: seq.snapshot() for seq in self.waiting + self.running}}

    def _restore(self, saved: dict) -> None:
        """Put back everything the failed step changed. The KV pools are not copied: a row writes only past its
        verified tokens, into its own blocks, except that a cached free block handed out during the step may
        have been overwritten, so it stays free but leaves the prefix cache."""
        self.waiting, self.running, self.done, self.free_blocks, self.refs = (
            type(x)(x) for x in saved["lists"])
        del self.steps[saved["steps"]:]
        self.auto_evidence, self._auto_gamma, gate = saved["auto"]
        if gate is not None:  # in place: a gate shared with the engines after this one keeps the restored state
            self.gate.__dict__.update(copy.deepcopy(gate).__dict__)
        self._overhead_samples = {kind: deque(samples, maxlen=OVERHEAD_WINDOW) for kind, samples in saved["overheads"].items()}
        (self._draft_was_behind, self._draft_first_s), self.last_step = saved["draft"], saved["last_step"]
        if self.prefix_cache is not None:
            self.prefix_cache.restore(saved["cache"])
            for block in self._overwritten:
                self.prefix_cache.evict(block)
        for seq, snapshot in saved["seqs"].items():
            seq.restore(snapshot)

    # ---- costs ------------------------------------------------------------------------------
    def measure_costs(self, rows: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), per_row: Sequence[int] = (1, 2, 3, 5, 9),
                      context: int = 128) -> tuple[BatchCosts, BatchCosts]:
        """Time target and draft forwards of ``rows`` decoding rows with ``per_row`` tokens each (the last token
        and its drafts) over ``context`` cached positions, and keep them for "auto" gamma."""
        if self.draft is None:
            raise ValueError("measuring speculation's costs needs a draft model")
        context = min(context, self.target.config.max_seq_len - max(per_row), self.draft.config.max_seq_len - max(per_row))
        num_blocks = max(rows) * blocks_for(context + max(per_row), self.block_size)
        costs = []
        for model in (self.target, self.draft):
            kv = _scratch_kv(model, num_blocks, self.block_size)  # dropped when the measurement ends
            costs.append(BatchCosts.measure(lambda r, k: _decode_forward(model, kv, r, k, context), list(rows), list(per_row),
                                            device=self.device))
        self.costs = tuple(costs)
        return self.costs


def _sample_rows(seqs: list[Seq], logits: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
    """Each row's distribution (its own sampling settings) and a token drawn from it with its own generator.
    Rows that share settings get their distributions in one call; greedy rows need no random draw."""
    probs: list[torch.Tensor | None] = [None] * len(seqs)
    for params in {s.params for s in seqs}:
        members = [b for b, s in enumerate(seqs) if s.params == params]
        for b, p in zip(members, params.probs(logits[members])):
            probs[b] = p
    tokens = [int(p.argmax()) if s.params.temperature == 0 else int(sample(p, s.generator)) for s, p in zip(seqs, probs)]
    return probs, tokens


def _stop_sequences(stop: str | Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Stop strings as byte-level token sequences, with a clear error for anything else."""
    strings = (stop,) if isinstance(stop, str) else stop
    if not isinstance(strings, (list, tuple)) or not all(isinstance(s, str) for s in strings):
        raise TypeError(f"stop must be a string or a list of strings, got {stop!r}")
    if any(not s for s in strings):
        raise ValueError("a stop string must not be empty")
    return tuple(tuple(tokenizer.encode(s)) for s in strings)


def _scratch_kv(model: Llama, num_blocks: int, block_size: int) -> PagedKV:
    """A paged cache that only :meth:`ServingEngine.measure_costs` writes to, freed when it returns."""
    return PagedKV(model.config, num_blocks, block_size, next(model.parameters()).dtype, model_device(model))


@torch.inference_mode()
def _decode_forward(model: Llama, kv: PagedKV, rows: int, per_row: int, context: int) -> None:
    """One forward of ``rows`` rows of ``per_row`` new tokens each over ``context`` cached positions."""
    blocks = blocks_for(context + per_row, kv.block_size)
    tables = [list(range(b * blocks, (b + 1) * blocks)) for b in range(rows)]
    paged_forward(model, kv, RaggedBatch([[1] * per_row] * rows, [context] * rows, tables))
