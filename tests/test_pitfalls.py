"""The fixed decoder of notebook 10 samples exactly from the target; the shipped one does not."""

import pytest
import torch

from specdec import buggy_decoder, pitfalls
from specdec.checks.core import CheckFailure
from specdec.checks.stats import compare_frequencies
from specdec.params import SamplingParams


def _round_outcomes(draft_propose, steps, params: SamplingParams, n: int = 20_000, seed: int = 0):
    """gamma = 1 with a toy target whose distribution after the draft depends on the draft token:
    the committed tuples of n rounds, and their exact distribution under the target."""
    g = torch.Generator().manual_seed(seed)
    V = 4
    draft_logits = torch.randn(V, generator=g, dtype=torch.float64)
    p0 = params.probs(torch.randn(V, generator=g, dtype=torch.float64))
    p_next = params.probs(torch.randn(V, V, generator=g, dtype=torch.float64))  # p_next[y]: the target after y
    tokens, q = draft_propose(draft_logits.expand(n, -1), params, g)
    p = torch.stack([p0.expand(n, -1), p_next[tokens]], 1)  # (n, 2, V)
    committed, counts = pitfalls.pitfall_round(p, q[:, None], tokens[:, None], g, steps=steps)
    runs = [tuple(row[:c].tolist()) for row, c in zip(committed, counts)]
    q0 = q[0]  # what the draft reports (the fixed draft's q is params.probs(draft_logits))
    exact = {(x,): float((p0[x] - q0[x]).clamp_min(0)) for x in range(V)}
    exact.update({(y, z): float(torch.minimum(p0[y], q0[y]) * p_next[y, z]) for y in range(V) for z in range(V)})
    return runs, exact


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3),
                                    SamplingParams()], ids=["T=1", "T=0.7,top-k", "greedy-draft"])
def test_fixed_decoder_samples_the_target_exactly(params):
    runs, exact = _round_outcomes(pitfalls.draft_propose, None, params)
    assert abs(sum(exact.values()) - 1) < 1e-12
    compare_frequencies(runs, exact, "pitfall_round")


@pytest.mark.parametrize("name", ["draft_propose", "correction_token", "bonus_token"])
def test_each_shipped_sampling_bug_breaks_exactness(name):
    params = SamplingParams(temperature=1.0)
    propose = buggy_decoder.draft_propose if name == "draft_propose" else pitfalls.draft_propose
    steps = {name: getattr(buggy_decoder, name)} if name != "draft_propose" else None
    runs, exact = _round_outcomes(propose, steps, params)
    with pytest.raises(CheckFailure):
        compare_frequencies(runs, exact, f"shipped {name}")


RIGHT = {"TOKENS_PER_S_CAP": 3.35e12 / (6_738_415_616 * 2), "EXPECTED_TOKENS": 3.3616, "SPEEDUP": 2.80133,
         "DISCARDED": 3, "ACCEPTANCE": 0.7}
WRONG = {"TOKENS_PER_S_CAP": 497.2, "EXPECTED_TOKENS": 2.3616, "SPEEDUP": 2.4, "DISCARDED": 2, "ACCEPTANCE": 0.5}


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_drill_numbers_accept_the_answer_and_reject_near_misses(name):
    from specdec.checks.pitfalls import check_drill_number

    check_drill_number(RIGHT, name)
    for wrong in (WRONG[name], None, True, str(RIGHT[name])):
        with pytest.raises(CheckFailure, match=name):
            check_drill_number({**RIGHT, name: wrong}, name)


@pytest.mark.parametrize("name, right", [("LARGE_BATCH", "b"), ("TEMPERATURES", "a")])
def test_drill_choices_take_exactly_one_letter(name, right):
    from specdec.checks.pitfalls import check_drill_choice

    check_drill_choice({name: right}, name)
    for wrong in {"a", "b", "c", "d", "B", None} - {right}:
        with pytest.raises(CheckFailure, match=name):
            check_drill_choice({name: wrong}, name)
