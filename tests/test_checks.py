"""The checks accept the reference, reject every catalogued mistake, and say why."""

from __future__ import annotations

import pytest

from specdec import analysis, chain, engine, greedy, kernels, ledger, lookup, metrics, params, pitfalls, rejection, tree
from specdec.checks import (
    CheckFailure,
    analysis as analysis_checks,
    chain as chain_checks,
    drafters as drafter_checks,
    engine as engine_checks,
    expect_close,
    expect_equal,
    frontier as frontier_checks,
    greedy as greedy_checks,
    kernels as kernel_checks,
    ledger as ledger_checks,
    lookup as lookup_checks,
    pitfalls as pitfall_checks,
    production as production_checks,
    questions2026 as questions2026_checks,
    rejection as rejection_checks,
    serving as serving_checks,
    tree as tree_checks,
)
from specdec.drafters import dynamic_tree, eagle, medusa, memory
from specdec.frontier import block, layerskip, long_context, moe
from specdec.mistakes import catalogue, for_exercise
from specdec.production import grammar, knobs, suffix
from specdec.questions2026 import drift, hybrid, ledger as ledger15, parallel
from specdec.serving import adaptive, blocks, commit, prefix_cache, scheduler

# exercise (function name) -> (reference, how to run its check on one implementation)
RUN_CHECK = {
    "count_params": (ledger.count_params, ledger_checks.check_count_params),
    "decode_step_floor_s": (ledger.decode_step_floor_s, lambda fn: ledger_checks.check_decode_floor(fn, ledger.tokens_per_s_cap)),
    "tokens_per_s_cap": (ledger.tokens_per_s_cap, lambda fn: ledger_checks.check_decode_floor(ledger.decode_step_floor_s, fn)),
    "kv_bytes_per_token": (ledger.kv_bytes_per_token, ledger_checks.check_kv_bytes_per_token),
    "expected_tokens_per_round": (ledger.expected_tokens_per_round, ledger_checks.check_expected_tokens_per_round),
    "speedup": (ledger.speedup, ledger_checks.check_speedup),
    "best_gamma": (ledger.best_gamma, ledger_checks.check_best_gamma),
    "roofline_step_time_s": (ledger.roofline_step_time_s, ledger_checks.check_roofline_step_time_s),
    "round_shapes": (greedy.round_shapes, greedy_checks.check_round_shapes),
    "greedy_verify": (greedy.greedy_verify, greedy_checks.check_greedy_verify),
    "greedy_verify_batched": (greedy.greedy_verify_batched, greedy_checks.check_greedy_verify_batched),
    "speculative_greedy_generate": (greedy.speculative_greedy_generate, greedy_checks.check_speculative_greedy_generate),
    "acceptance_probability": (rejection.acceptance_probability, rejection_checks.check_acceptance_probability),
    "residual_distribution": (rejection.residual_distribution, rejection_checks.check_residual_distribution),
    "verify_token": (rejection.verify_token, rejection_checks.check_verify_token),
    "output_paths": (rejection.output_paths, rejection_checks.check_output_paths),
    "acceptance_rate": (rejection.acceptance_rate, rejection_checks.check_acceptance_rate),
    "verify_chain": (chain.verify_chain, chain_checks.check_verify_chain),
    "expected_committed_length": (chain.expected_committed_length, chain_checks.check_expected_committed_length),
    "best_gamma_measured": (chain.best_gamma_measured, chain_checks.check_best_gamma_measured),
    "verify_chain_batched": (chain.verify_chain_batched, chain_checks.check_verify_chain_batched),
    "speculative_round": (chain.speculative_round, chain_checks.check_speculative_round),
    "target_only_generate": (engine.target_only_generate, engine_checks.check_target_only_generate),
    "propose": (engine.propose, engine_checks.check_propose),
    "rollback": (engine.rollback, engine_checks.check_rollback),
    "speculative_generate": (engine.speculative_generate, engine_checks.check_speculative_generate),
    "accept_until_stop": (params.accept_until_stop, engine_checks.check_accept_until_stop),
    "generate_until_stop": (engine.generate_until_stop, engine_checks.check_generate_until_stop),
    "find_match": (lookup.find_match, lookup_checks.check_find_match),
    "propose_ngram": (lookup.propose_ngram, lookup_checks.check_propose_ngram),
    "find_match_vectorised": (lookup.find_match_vectorised, lookup_checks.check_find_match_vectorised),
    "lookup_generate": (lookup.lookup_generate, lookup_checks.check_lookup_generate),
    "flatten_tree": (tree.flatten_tree, tree_checks.check_flatten_tree),
    "tree_mask": (tree.tree_mask, tree_checks.check_tree_mask),
    "tree_position_ids": (tree.tree_position_ids, tree_checks.check_tree_position_ids),
    "verify_tree_greedy": (tree.verify_tree_greedy, tree_checks.check_verify_tree_greedy),
    "verify_tree_sampling": (tree.verify_tree_sampling, tree_checks.check_verify_tree_sampling),
    "compact_cache": (tree.compact_cache, tree_checks.check_compact_cache),
    "race_kernel": (kernels.race_kernel, kernel_checks.check_race_kernel),
    "logsumexp_kernel": (kernels.logsumexp_kernel, kernel_checks.check_logsumexp_kernel),
    "verify_chain_kernel": (kernels.verify_chain_kernel, kernel_checks.check_verify_chain_kernel),
    "tree_attention_kernel": (kernels.tree_attention_kernel, kernel_checks.check_tree_attention_kernel),
    "acceptance_from_rounds": (analysis.acceptance_from_rounds, analysis_checks.check_acceptance_from_rounds),
    "alpha_from_rate": (metrics.alpha_from_rate, analysis_checks.check_alpha_from_rate),
    "measured_costs": (analysis.measured_costs, analysis_checks.check_measured_costs),
    "predicted_speedup": (analysis.predicted_speedup, analysis_checks.check_predicted_speedup),
    "best_measured_gamma": (analysis.best_measured_gamma, analysis_checks.check_best_measured_gamma),
    "draft_propose": (pitfalls.draft_propose, pitfall_checks.check_draft_propose),
    "draft_token_probs": (pitfalls.draft_token_probs, pitfall_checks.check_draft_token_probs),
    "accept_drafts": (pitfalls.accept_drafts, pitfall_checks.check_accept_drafts),
    "accepted_counts": (pitfalls.accepted_counts, pitfall_checks.check_accepted_counts),
    "residual": (pitfalls.residual, pitfall_checks.check_residual),
    "correction_token": (pitfalls.correction_token, pitfall_checks.check_correction_token),
    "bonus_token": (pitfalls.bonus_token, pitfall_checks.check_bonus_token),
    "verify_logits": (pitfalls.verify_logits, pitfall_checks.check_verify_logits),
    "stream_counts": (pitfalls.stream_counts, pitfall_checks.check_stream_counts),
    "reserve_slots": (blocks.reserve_slots, serving_checks.check_reserve_slots),
    "release_slots": (blocks.release_slots, serving_checks.check_release_slots),
    "slot_mapping": (blocks.slot_mapping, serving_checks.check_slot_mapping),
    "commit_round": (commit.commit_round, serving_checks.check_commit_round),
    "schedule_step": (scheduler.schedule_step, serving_checks.check_schedule_step),
    "choose_gamma": (adaptive.choose_gamma, serving_checks.check_choose_gamma),
    "medusa_head_logits": (medusa.medusa_head_logits, drafter_checks.check_medusa_head_logits),
    "medusa_candidates": (medusa.medusa_candidates, drafter_checks.check_medusa_candidates),
    "eagle_inputs": (eagle.eagle_inputs, drafter_checks.check_eagle_inputs),
    "eagle_draft_step": (eagle.eagle_draft_step, drafter_checks.check_eagle_draft_step),
    "expand_dynamic_tree": (dynamic_tree.expand_dynamic_tree, drafter_checks.check_expand_dynamic_tree),
    "drafter_cost": (memory.drafter_cost, drafter_checks.check_drafter_cost),
    "match_prefix": (prefix_cache.match_prefix, production_checks.check_match_prefix),
    "publish_blocks": (prefix_cache.publish_blocks, production_checks.check_publish_blocks),
    "speculative_masks": (grammar.speculative_masks, production_checks.check_speculative_masks),
    "constrained_round": (grammar.constrained_round, production_checks.check_constrained_round),
    "propose_from_tree": (suffix.propose_from_tree, production_checks.check_propose_from_tree),
    "k_schedule": (knobs.k_schedule, production_checks.check_k_schedule),
    "lookup_k": (knobs.lookup_k, production_checks.check_lookup_k),
    "expected_experts_touched": (moe.expected_experts_touched, frontier_checks.check_expected_experts_touched),
    "experts_touched": (moe.experts_touched, frontier_checks.check_experts_touched),
    "moe_step_seconds": (moe.moe_step_seconds, frontier_checks.check_moe_step_seconds),
    "step_seconds": (long_context.step_seconds, frontier_checks.check_step_seconds),
    "crossover_batch": (long_context.crossover_batch, frontier_checks.check_crossover_batch),
    "layer_skip_generate": (layerskip.layer_skip_generate, frontier_checks.check_layer_skip_generate),
    "block_weights": (block.block_weights, frontier_checks.check_block_weights),
    "block_verify": (block.block_verify, frontier_checks.check_block_verify),
    "parallel_training_mask": (parallel.parallel_training_mask, questions2026_checks.check_parallel_training_mask),
    "parallel_propose": (parallel.parallel_propose, questions2026_checks.check_parallel_propose),
    "acceptance_by_position": (ledger15.acceptance_by_position, questions2026_checks.check_acceptance_by_position),
    "best_gamma_by_position": (ledger15.best_gamma_by_position, questions2026_checks.check_best_gamma_by_position),
    "select_states": (hybrid.select_states, questions2026_checks.check_select_states),
    "hybrid_speculative_generate": (hybrid.hybrid_speculative_generate,
                                    questions2026_checks.check_hybrid_speculative_generate),
    "committed_logprobs": (drift.committed_logprobs, questions2026_checks.check_committed_logprobs),
}
MISTAKES = catalogue()


def test_every_exercise_of_the_notebooks_has_a_check():
    """The reference and every catalogued mistake run through the notebooks' own test cells, whose hidden part is the
    check (tests/test_mistakes_in_notebooks.py); here, the checks' other behaviour on every exercise."""
    from test_mistakes_in_notebooks import CATALOGUES, _exercises

    assert set(RUN_CHECK) == {name for slug in CATALOGUES for name in _exercises(slug)}
    assert {m.exercise for m in MISTAKES} <= set(RUN_CHECK)


@pytest.mark.parametrize("exercise", sorted(RUN_CHECK))
def test_every_exercise_has_mistakes(exercise):
    assert for_exercise(exercise), f"no catalogued mistake for {exercise}"


@pytest.mark.parametrize("exercise", sorted(RUN_CHECK))
def test_skeleton_fails_with_not_implemented_message(exercise):
    def skeleton(*args):
        raise NotImplementedError()

    skeleton.__name__ = exercise
    if exercise.endswith("_kernel"):  # a Triton kernel, as nbgrader's skeleton leaves it
        skeleton = kernel_skeleton(RUN_CHECK[exercise][0])
    with pytest.raises(CheckFailure, match="not implemented yet"):
        RUN_CHECK[exercise][1](skeleton)


def test_unimplemented_callee_is_named():
    def speedup(a, gamma, c):
        raise NotImplementedError()

    def best_gamma(a, c, max_gamma=32):
        return speedup(a, 1, c)

    with pytest.raises(CheckFailure, match="calls speedup, which is not implemented yet"):
        ledger_checks.check_best_gamma(best_gamma)


def test_failing_upstream_exercise_is_named():
    namespace = {"expected_tokens_per_round": lambda a, gamma: 1.0 + gamma * a}
    exec("def speedup(a, gamma, c):\n    return expected_tokens_per_round(a, gamma) / (1 + gamma * c)", namespace)
    with pytest.raises(CheckFailure, match="calls your expected_tokens_per_round, which fails its own test"):
        ledger_checks.check_speedup(namespace["speedup"])


def test_wrong_type_is_reported():
    with pytest.raises(CheckFailure, match="return an int"):
        ledger_checks.check_count_params(lambda cfg: float(ledger.count_params(cfg)))
    with pytest.raises(CheckFailure, match="expected 1, got None"):
        ledger_checks.check_best_gamma(lambda a, c, max_gamma=32: None)


def test_message_shows_the_input():
    def count_params(cfg):
        return ledger.count_params(cfg) + 1

    with pytest.raises(CheckFailure, match=r"count_params\(llama-2-7b: vocab 32000, d_model 4096"
                                           r".*expected 6,738,415,616, got 6,738,415,617"):
        ledger_checks.check_count_params(count_params)


def test_visible_helpers_name_the_likely_mistake():
    def expected_tokens_per_round(a, gamma):
        return ledger.expected_tokens_per_round(a, gamma) - 1

    with pytest.raises(CheckFailure, match=r"expected_tokens_per_round\(0.8, 4\): expected 3.3616"
                                           r".*got 2.3616.*only accepted drafts"):
        expect_close(expected_tokens_per_round, (0.8, 4), 3.3616)
    with pytest.raises(CheckFailure, match="return an int"):
        expect_equal(lambda: 8.0, (), 8, label="best_gamma(...)")
    expect_equal(ledger.best_gamma, (0.8, 0.05), 8)


def kernel_skeleton(kernel):
    """The reference kernel with its body replaced by nbgrader's `raise NotImplementedError()`."""
    import inspect
    import re

    import triton
    import triton.language as tl

    source = re.sub(r"### BEGIN SOLUTION.*### END SOLUTION", "raise NotImplementedError()",
                    inspect.getsource(kernel.fn), flags=re.S)
    namespace = {"triton": triton, "tl": tl}
    exec(compile(source, f"<skeleton {kernel.fn.__name__}>", "exec"), namespace)
    return namespace[kernel.fn.__name__]


def test_kernel_check_refuses_a_plain_function():
    with pytest.raises(CheckFailure, match="must be a Triton kernel"):
        kernel_checks.check_race_kernel(lambda *args: None)


def test_the_sampling_checks_memoized_models_give_the_plain_models_outputs():
    """The sampling checks run their thousands of loops on memoized models (specdec.checks.memo): every run gives
    the same tokens as on the plain models, for the reference and for mistakes that leave stale or extra cache
    entries, and a forward that differs in anything it reads (here the cached V values) is computed, not replayed."""
    import torch

    from specdec.checks.engine import SAMPLING_PARAMS, sampling_pair, tiny_pair
    from specdec.models.model import KVCache

    plain, memo = tiny_pair(vocab=6, noise=0.5, seed=3), sampling_pair()
    stale = {m.name: m.fn for m in for_exercise("speculative_generate")}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the checks run
    try:
        for fn in (engine.speculative_generate, stale["no_rollback"], stale["no_draft_catch_up"]):
            runs = []
            for models in (plain, memo, memo):  # the second pass on the memoized pair replays from memory
                g = torch.Generator().manual_seed(0)
                runs.append([fn(*models, [1, 2], 3, 2, SAMPLING_PARAMS[1], g) for _ in range(25)])
            assert runs[0] == runs[1] == runs[2], fn
    finally:
        torch.set_num_threads(threads)
    target = memo[0]
    with torch.inference_mode():
        caches = [KVCache(target.config) for _ in range(3)]
        for cache in caches:
            target(torch.tensor([[1, 2, 3]]), cache)
        caches[2].v[:, :, :, :3] += 1.0  # the same length and tokens, other values: the next forward is no replay
        seen = len(target._memo)
        first, again = (target(torch.tensor([[4]]), c) for c in caches[:2])
        assert len(target._memo) == seen + 1 and torch.equal(first, again)
        assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
        changed = target(torch.tensor([[4]]), caches[2])
        assert len(target._memo) == seen + 2 and not torch.equal(changed, first)
        assert torch.equal(first, plain[0](torch.tensor([[1, 2, 3, 4]]))[:, -1:]) or torch.allclose(
            first, plain[0](torch.tensor([[1, 2, 3, 4]]))[:, -1:], atol=1e-5)


def test_changing_an_input_in_place_fails_with_what_changed():
    """A pure exercise that changes the caller's list or tensor loses its points, whatever it returns."""
    def find_match(tokens, n):
        answer = lookup.find_match(list(tokens), n)
        tokens.append(0)  # the caller's list now has a token it never generated
        return answer

    with pytest.raises(CheckFailure, match=r"find_match\(.*changed its argument 1 in place: it was \["):
        lookup_checks.check_find_match(find_match)

    def greedy_verify(draft, target_logits):
        answer = greedy.greedy_verify(draft, target_logits)
        target_logits[0, 0] = 1e9  # a scratch write into the target's logits
        return answer

    with pytest.raises(CheckFailure, match="changed its argument 2 in place"):
        greedy_checks.check_greedy_verify(greedy_verify)

    def acceptance_rate(p, q):
        q /= q.sum() * 2  # a normalisation done in place, and wrongly
        return rejection.acceptance_rate(p, q * 2)

    with pytest.raises(CheckFailure, match="changed its argument 2 in place"):
        rejection_checks.check_acceptance_rate(acceptance_rate)
