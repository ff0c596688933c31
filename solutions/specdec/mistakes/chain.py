"""Known-wrong answers to the exercises of notebook 04 (verifying a whole chain)."""

from __future__ import annotations

import torch

from specdec.chain import expected_committed_length, verify_chain
from specdec.greedy import PAD
from specdec.mistakes import Mistake
from specdec.rejection import residual_distribution
from specdec.sampling import probs_from_logits


def _chain(p, q, draft, generator=None, *, bonus_argmax=False, keep_going=False, from_p=False, bonus=True,
           float32=False, residual_floor=0.0, bonus_from_global=False):
    gamma, committed = draft.shape[0], []
    for i in range(gamma):
        y = int(draft[i])
        if float32:  # a float32 uniform against a float32 ratio
            accept = bool(torch.rand((), generator=generator) < (p[i, y] / q[i, y]).float())
        else:
            accept = float(torch.rand((), generator=generator, dtype=torch.float64)) * float(q[i, y]) < float(p[i, y])
        if accept:
            committed.append(y)
            continue
        excess = (p[i].double() - q[i].double()).clamp_min(0)
        if from_p or excess.sum() <= residual_floor:
            fallback = p[i].double()
        else:
            fallback = residual_distribution(p[i], q[i])
        committed.append(int(torch.multinomial(fallback, 1, generator=generator)))
        if not keep_going:
            return torch.tensor(committed)
    if not bonus:
        return torch.tensor(committed)
    bonus_generator = None if bonus_from_global else generator  # None: torch's global random state
    extra = int(p[gamma].argmax()) if bonus_argmax else int(torch.multinomial(p[gamma].double(), 1, generator=bonus_generator))
    return torch.tensor(committed + [extra])


def _batched(fn):
    def batched(p, q, draft, generator=None):
        rows = [fn(p[b], q[b], draft[b], generator) for b in range(draft.shape[0])]
        tokens = torch.full((draft.shape[0], draft.shape[1] + 1), PAD, dtype=torch.long)
        for b, row in enumerate(rows):
            tokens[b, : len(row)] = row[: draft.shape[1] + 1]
        return tokens, torch.tensor([min(len(r), draft.shape[1] + 1) for r in rows])

    return batched


def _batched_bonus_always(p, q, draft, generator=None):
    """Writes a bonus from p[gamma] after the correction even when a draft was rejected."""
    tokens, n = _batched(verify_chain)(p, q, draft, generator)
    gamma = draft.shape[1]
    for b in range(draft.shape[0]):
        if n[b] <= gamma:
            tokens[b, n[b]] = int(torch.multinomial(p[b, gamma].double(), 1, generator=generator))
            n[b] += 1
    return tokens, n


def _round(target, draft, context, gamma, temperature, generator, *, argmax_draft=False, p_temperature=None):
    proposal, q_rows = context.clone(), []
    for _ in range(gamma):
        logits = draft.next_logits(proposal)
        q_i = probs_from_logits(logits, temperature)
        y = logits.argmax().view(1) if argmax_draft else torch.multinomial(q_i, 1, generator=generator)
        proposal = torch.cat([proposal, y])
        q_rows.append(q_i)
    t_p = temperature if p_temperature is None else p_temperature
    p = probs_from_logits(target.logits(proposal)[-(gamma + 1):], t_p)
    return verify_chain(p, torch.stack(q_rows), proposal[len(context):], generator)


def _round_draft_t1(target, draft, context, gamma, temperature, generator):
    proposal, q_rows = context.clone(), []
    for _ in range(gamma):
        logits = draft.next_logits(proposal)
        y = torch.multinomial(probs_from_logits(logits, 1.0), 1, generator=generator)
        q_i = probs_from_logits(logits, temperature)
        if q_i[y] <= 0:
            q_i = probs_from_logits(logits, 1.0)
        proposal = torch.cat([proposal, y])
        q_rows.append(q_i)
    p = probs_from_logits(target.logits(proposal)[-(gamma + 1):], temperature)
    return verify_chain(p, torch.stack(q_rows), proposal[len(context):], generator)


MISTAKES: list[Mistake] = [
    Mistake("verify_chain", "bonus_argmax", lambda p, q, d, g=None: _chain(p, q, d, g, bonus_argmax=True),
            "the bonus token is the argmax of p[gamma]; in sampling mode it must be sampled from p[gamma]."),
    Mistake("verify_chain", "continue_after_rejection", lambda p, q, d, g=None: _chain(p, q, d, g, keep_going=True),
            "verification goes on after a rejection; the drafts after it were conditioned on a token that is gone, "
            "so stop there."),
    Mistake("verify_chain", "resample_from_p", lambda p, q, d, g=None: _chain(p, q, d, g, from_p=True),
            "the correction is drawn from p; draw it from the residual max(p - q, 0) normalised."),
    Mistake("verify_chain", "no_bonus", lambda p, q, d, g=None: _chain(p, q, d, g, bonus=False),
            "no bonus token when every draft is accepted."),
    Mistake("expected_committed_length", "sum_not_product", lambda a: 1.0 + sum(a),
            "the a_i are added; draft i counts only if drafts 1..i all pass, probability a_1 * ... * a_i."),
    Mistake("expected_committed_length", "no_target_token", lambda a: expected_committed_length(a) - 1.0,
            "the target's own token (correction or bonus) is missing: E starts at 1."),
    Mistake("expected_committed_length", "iid_first_rate",
            lambda a: expected_committed_length([a[0]] * len(a)) if len(a) else 1.0,
            "every position is given the first position's rate; use each a_i."),
    Mistake("best_gamma_measured", "fixed_verify_time",
            lambda a, t, v: max(range(1, len(v) + 1), key=lambda g: (expected_committed_length(a[:g]) / (g * t + v[0]), -g)),
            "verification time is taken as constant; use verify_s[g - 1], the measured time for g + 1 positions."),
    Mistake("best_gamma_measured", "largest_on_tie",
            lambda a, t, v: max(range(1, len(v) + 1), key=lambda g: (expected_committed_length(a[:g]) / (g * t + v[g - 1]), g)),
            "ties go to the larger gamma; take the smallest."),
    Mistake("best_gamma_measured", "tokens_only",
            lambda a, t, v: max(range(1, len(v) + 1), key=lambda g: (expected_committed_length(a[:g]), -g)),
            "gamma is chosen by tokens per round, ignoring what the round costs."),
    Mistake("verify_chain_batched", "bonus_argmax", _batched(lambda p, q, d, g=None: _chain(p, q, d, g, bonus_argmax=True)),
            "the bonus is the argmax of p[gamma]; sample it."),
    Mistake("verify_chain_batched", "continue_after_rejection",
            _batched(lambda p, q, d, g=None: _chain(p, q, d, g, keep_going=True)),
            "rows go on after their first rejection (count accepted with a cumulative product, not a sum)."),
    Mistake("verify_chain_batched", "bonus_after_rejection", _batched_bonus_always,
            "a bonus is written after the correction in rows that had a rejection; only fully accepted rows get a bonus."),
    Mistake("verify_chain_batched", "python_loop", _batched(verify_chain),
            "right answers from a Python loop over rows: one small operation (and on a GPU one host sync) per position."),
    Mistake("verify_chain_batched", "resample_from_p", _batched(lambda p, q, d, g=None: _chain(p, q, d, g, from_p=True)),
            "the correction is drawn from p instead of the residual."),
    Mistake("speculative_round", "argmax_draft_softmax_q",
            lambda t, d, c, g, T, gen: _round(t, d, c, g, T, gen, argmax_draft=True),
            "the draft token is the argmax but q is the softmax: q must be the distribution the token was drawn from "
            "(one-hot for a greedy draft)."),
    Mistake("speculative_round", "target_at_temperature_1",
            lambda t, d, c, g, T, gen: _round(t, d, c, g, T, gen, p_temperature=1.0),
            "the target's probabilities ignore the temperature; p must apply the request's sampling settings."),
    Mistake("speculative_round", "draft_at_temperature_1", _round_draft_t1,
            "the draft samples at temperature 1 but the verifier is told the tempered q; q must be what the draft sampled from "
            "(here: sample the draft at `temperature`, as stated)."),
    Mistake("verify_chain", "float32_uniforms", lambda p, q, d, g=None: _chain(p, q, d, g, float32=True),
            "the uniform and the ratio are float32: a ratio of 1 - 2e-10 rounds to 1.0 and is always accepted; draw u "
            "in float64 as stated."),
    Mistake("verify_chain", "tiny_residual_as_zero", lambda p, q, d, g=None: _chain(p, q, d, g, residual_floor=1e-9),
            "a residual of mass below 1e-9 is replaced by p; normalise it however small (fall back to p only at 0)."),
    Mistake("verify_chain_batched", "tiny_residual_as_zero",
            _batched(lambda p, q, d, g=None: _chain(p, q, d, g, residual_floor=1e-9)),
            "a residual of mass below 1e-9 is replaced by p; normalise it however small."),
    Mistake("verify_chain_batched", "float32_uniforms", _batched(lambda p, q, d, g=None: _chain(p, q, d, g, float32=True)),
            "the uniforms and ratios are float32; draw them in float64."),
    Mistake("verify_chain", "global_rng", lambda p, q, d, g=None: _chain(p, q, d, None),
            "Draw every uniform and every sample with the generator you are given."),
    Mistake("verify_chain", "bonus_from_global_rng", lambda p, q, d, g=None: _chain(p, q, d, g, bonus_from_global=True),
            "the bonus token is drawn from torch's global random state: pass the generator there too."),
    Mistake("verify_chain_batched", "bonus_from_global_rng",
            _batched(lambda p, q, d, g=None: _chain(p, q, d, g, bonus_from_global=True)),
            "the bonus token is drawn from torch's global random state: pass the generator there too."),
]
