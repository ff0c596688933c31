"""Known-wrong answers to the exercises of notebook 03 (rejection sampling at one position)."""

from __future__ import annotations

import torch

from specdec.mistakes import Mistake
from specdec.rejection import residual_distribution


def _resample_from_p(p, q, y, u, generator=None):
    if u * float(q[y]) < float(p[y]):
        return True, int(y)
    return False, int(torch.multinomial(p.to(torch.float64), 1, generator=generator))


def _u_less_equal(p, q, y, u, generator=None):
    if u <= float(p[y]) / float(q[y]):
        return True, int(y)
    return False, int(torch.multinomial(residual_distribution(p, q), 1, generator=generator))


def _accept_by_q_over_p(p, q, y, u, generator=None):
    if float(p[y]) > 0 and u < float(q[y]) / float(p[y]):
        return True, int(y)
    return False, int(torch.multinomial(residual_distribution(p, q), 1, generator=generator))


def _residual_from_q(p, q, y, u, generator=None):
    if u * float(q[y]) < float(p[y]):
        return True, int(y)
    excess = (q - p).clamp_min(0).to(torch.float64)
    return False, int(torch.multinomial(excess if excess.sum() > 0 else p.double(), 1, generator=generator))


def _float32_compare(p, q, y, u, generator=None):
    ratio = (p[y].float() / q[y].float()) if float(q[y]) > 0 else torch.tensor(0.0)
    if torch.tensor(u, dtype=torch.float32) < ratio:
        return True, int(y)
    return False, int(torch.multinomial(residual_distribution(p, q), 1, generator=generator))


def _residual_global_rng(p, q, y, u, generator=None):
    if u * float(q[y]) < float(p[y]):
        return True, int(y)
    return False, int(torch.multinomial(residual_distribution(p, q), 1))


def _unnormalised(p, q):
    return (p.double() - q.double()).clamp_min(0)


def _nan_when_equal(p, q):
    excess = (p.double() - q.double()).clamp_min(0)
    return excess / excess.sum()


def _q_minus_p(p, q):
    excess = (q.double() - p.double()).clamp_min(0)
    return excess / excess.sum() if excess.sum() > 0 else p.double()


def _paths_resample_from_p(p, q):
    p, q = p.double(), q.double()
    accept = torch.minimum(p, q)
    return accept, (1 - accept.sum()) * p


def _paths_unscaled_residual(p, q):
    return torch.minimum(p.double(), q.double()), residual_distribution(p, q)


def _paths_accept_is_q(p, q):
    p, q = p.double(), q.double()
    return q.clone(), (p - q).clamp_min(0)


MISTAKES: list[Mistake] = [
    Mistake("acceptance_probability", "no_min", lambda p, q, y: float(p[y]) / float(q[y]),
            "p(y)/q(y) can exceed 1; a probability is min(1, p(y)/q(y))."),
    Mistake("acceptance_probability", "wrong_index", lambda p, q, y: min(1.0, float(p[y]) / float(q.max())),
            "q is read at the wrong token; use q(y), the probability the draft gave the token it proposed."),
    Mistake("acceptance_probability", "inverted", lambda p, q, y: min(1.0, float(q[y]) / float(p[y])) if p[y] > 0 else 1.0,
            "the ratio is upside down: accept with min(1, p(y)/q(y)), target over draft."),
    Mistake("residual_distribution", "unnormalised", _unnormalised,
            "max(p - q, 0) is not normalised: divide by its sum (the rejection probability)."),
    Mistake("residual_distribution", "nan_when_equal", _nan_when_equal,
            "p == q gives 0/0 = NaN; guard the zero sum (return p)."),
    Mistake("residual_distribution", "q_minus_p", _q_minus_p,
            "max(q - p, 0) has it backwards: rejections must add mass where the target wants more than the draft gives."),
    Mistake("residual_distribution", "just_p", lambda p, q: p.double(),
            "p itself is the 'resample from p' rule; the residual is max(p - q, 0) normalised."),
    Mistake("verify_token", "resample_from_p", _resample_from_p,
            "after a rejection the token is drawn from p; draw it from the residual max(p - q, 0) / sum, "
            "or tokens the draft already over-proposes get counted twice."),
    Mistake("verify_token", "u_less_equal", _u_less_equal,
            "u <= p/q accepts at u = 0 even when p(y) = 0; use a strict u < p(y)/q(y)."),
    Mistake("verify_token", "inverted_ratio", _accept_by_q_over_p,
            "the acceptance ratio is upside down: accept when u < p(y)/q(y)."),
    Mistake("verify_token", "residual_from_q", _residual_from_q,
            "the rejection fallback uses max(q - p, 0); it is max(p - q, 0)."),
    Mistake("output_paths", "resample_from_p", _paths_resample_from_p,
            "the reject path uses p: that is the wrong rule that resamples from p after a rejection."),
    Mistake("output_paths", "unscaled_residual", _paths_unscaled_residual,
            "the reject path is the residual itself; weight it by the probability of a rejection, beta = sum max(p - q, 0)."),
    Mistake("output_paths", "accept_is_q", _paths_accept_is_q,
            "the accept path is q; a proposal x is kept only with probability min(1, p(x)/q(x))."),
    Mistake("acceptance_rate", "total_variation", lambda p, q: 0.5 * float((p.double() - q.double()).abs().sum()),
            "that is TV(p, q); the acceptance rate is 1 - TV(p, q) = sum min(p, q)."),
    Mistake("acceptance_rate", "inner_product", lambda p, q: float((p.double() * q.double()).sum()),
            "sum p*q is the chance two independent samples agree (exact-match verification), not the acceptance rate."),
    Mistake("verify_token", "float32_comparison", _float32_compare,
            "Compare in float64: a float32 u or ratio has 7 significant digits and flips decisions near the boundary."),
    Mistake("verify_token", "global_rng", _residual_global_rng,
            "Draw the residual sample with the generator you are given."),
]
