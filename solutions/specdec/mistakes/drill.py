"""Known-wrong answers to the interview drills of notebooks 12, 13, 14 and 15 (``specdec.checks.drill``).

A drill question is answered with a number or a letter, not a function, so its catalogued mistakes are
values: each :class:`WrongAnswer` is an answer a learner plausibly gives and the slip that produces it.
The check names the slip when an answer matches one; the tests prove that every catalogued answer fails
its question, both through the check and through the notebook's test cell.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.frontier.moe import expected_experts_touched as expected_union


@dataclass(frozen=True)
class WrongAnswer:
    """A wrong answer to the drill question ``question`` (a number, or a letter for a choice)."""

    question: str
    value: float | str
    hint: str


WRONG_ANSWERS: tuple[WrongAnswer, ...] = (
    # -- notebook 12: numbers --------------------------------------------------------------------------------
    WrongAnswer("EAGLE_KV_MIB", 4096, "K and V are stored per KV head: 8 heads of width 128 (1,024 values), not "
                "the 32 query heads (grouped-query attention)"),
    WrongAnswer("EAGLE_KV_MIB", 32768, "that is the target's own KV (32 layers); the drafter has one layer"),
    WrongAnswer("EAGLE_KV_MIB", 512, "a layer caches K and V: two vectors per token, not one"),
    WrongAnswer("MEDUSA_PARAMS", 83_906_560, "each head also has its own vocabulary projection, V x d: the "
                "residual blocks are the small part"),
    WrongAnswer("MEDUSA_PARAMS", 609_243_136, "each head has its own vocabulary projection; one shared projection "
                "is counted here"),
    WrongAnswer("MEDUSA_PARAMS", 2_168_471_552, "that is 4 heads (the notebook's example); the question has 5"),
    WrongAnswer("MEDUSA_TREE_POSITIONS", 21, "the verify forward also scores the root, the last committed token"),
    WrongAnswer("MEDUSA_TREE_POSITIONS", 12, "every prefix of a path is a node too, not only the 12 deepest ones"),
    WrongAnswer("MEDUSA_TREE_POSITIONS", 7, "the tree is a Cartesian product: each node of a level has its own "
                "children, so the levels multiply, they do not add"),
    WrongAnswer("EAGLE2_NODES_CREATED", 384, "step 1 expands only the root, into top_k children; the top_k-squared "
                "steps are the depth - 1 after it"),
    WrongAnswer("EAGLE2_NODES_CREATED", 299_592, "each step expands only the top_k best nodes of the step before, "
                "not all of them: the tree does not grow by a factor top_k per level"),
    WrongAnswer("EAGLE2_NODES_CREATED", 61, "that is what the target verifies (the budget and the root); the "
                "drafter creates far more nodes before the rerank"),
    WrongAnswer("TAU_FROM_RATES", 2.15, "tau counts the correction or bonus token the target adds every round"),
    WrongAnswer("TAU_FROM_RATES", 2.5608, "acceptance by position is already unconditional (the fraction of rounds "
                "that accepted at least i drafts): add the rates, do not multiply them"),
    WrongAnswer("MTP_TAU", 3.38, "conditional rates must be multiplied: draft 2 survives only if draft 1 did"),
    WrongAnswer("MTP_TAU", 2.0768, "a round also commits the target's own token (the correction or bonus)"),
    # -- notebook 12: choices ---------------------------------------------------------------------------------
    WrongAnswer("NO_KV", "a", "a separate draft model keeps its own KV cache, every layer of it"),
    WrongAnswer("NO_KV", "b", "EAGLE's drafter is a decoder layer with attention: it keeps that layer's KV"),
    WrongAnswer("NO_KV", "d", "an MTP module is a transformer block: it keeps its attention's KV, one block's per "
                "depth"),
    WrongAnswer("TYPICAL", "a", "how the heads were trained changes acceptance, not exactness: speculative sampling "
                "with the q the drafts came from is exact for any drafter"),
    WrongAnswer("TYPICAL", "b", "tree attention gives each candidate exactly the context of its own path: the "
                "target's logits are the ones plain decoding would compute"),
    WrongAnswer("TYPICAL", "c", "the heads are meant to read that state: it is the one that predicted the root"),
    WrongAnswer("EAGLE_SHIFT", "a", "that is the classic off-by-one: f_t has already read x_t, so the pair tells "
                "the drafter nothing about which token was sampled next"),
    WrongAnswer("EAGLE_SHIFT", "c", "x_(t-1) is older still: f_t has read it"),
    WrongAnswer("EAGLE_SHIFT", "d", "the feature alone is Medusa's input; EAGLE adds the sampled token to resolve "
                "the feature's uncertainty"),
    # -- notebook 13: numbers --------------------------------------------------------------------------------
    WrongAnswer("PUBLISHED_BLOCKS", 7, "block 6 has every slot written, but 5 of them hold rejected drafts' K and "
                "V: only blocks full of verified tokens may be published"),
    WrongAnswer("PUBLISHED_BLOCKS", 8, "block 7 is a lookahead block (a rejected draft's slot): never published"),
    WrongAnswer("PREFILL_TOKENS", 30, "turn 1's last block was never full of computed K and V (199 of 200 "
                "tokens), so it was never published: reuse is by whole blocks"),
    WrongAnswer("PREFILL_TOKENS", 31, "the cache is reused by whole published blocks, not token by token"),
    WrongAnswer("PREFILL_TOKENS", 22, "a partial block is never published, so it cannot be hit"),
    WrongAnswer("ALPHA_FROM_COUNTERS", 0.625, "that is the draft acceptance rate (accepted over proposed), not "
                "alpha: it falls with gamma at a fixed alpha"),
    WrongAnswer("ALPHA_FROM_COUNTERS", 1 - 1 / 3.5, "1 - 1 / tau inverts E = 1 / (1 - alpha), the limit of "
                "infinitely many drafts; with gamma = 4, solve (1 - alpha^5) / (1 - alpha) = tau"),
    WrongAnswer("K_AT_BATCH", 2, "acceptance_rates are unconditional (rounds that accepted draft i over all "
                "rounds): tau = 1 + their sum, no products"),
    WrongAnswer("K_AT_BATCH", 4, "the longest K commits the most per step but costs more per step: compare "
                "tokens per second, tau / itl"),
    WrongAnswer("K_AT_BATCH", 0, "speculation still pays at this batch: compare tau / itl for every K"),
    WrongAnswer("PADDED_TOKENS", 7, "each request carries 1 + K tokens (its last committed token and K drafts), "
                "not K"),
    WrongAnswer("PADDED_TOKENS", 96, "96 is the captured size the batch is padded to; the question asks for the "
                "padding"),
    WrongAnswer("PADDED_TOKENS", 52, "the batch is padded to the next captured size in the list, not to a power "
                "of two"),
    WrongAnswer("SUFFIX_DRAFTS", 8, "the cap is int(factor x match length): int(7.5) = 7, rounded down"),
    WrongAnswer("SUFFIX_DRAFTS", 9, "the walk also stops at min(max_drafts, int(factor x match length)) drafts, "
                "not only when the estimate falls below min_prob"),
    WrongAnswer("SUFFIX_DRAFTS", 16, "max_drafts is an upper bound; the match length caps the proposal first"),
    # -- notebook 13: choices ---------------------------------------------------------------------------------
    WrongAnswer("LOOKAHEAD_BLOCK", "b", "the target computed those K and V, but for drafts that were rejected: "
                "the block does not hold the committed tokens"),
    WrongAnswer("LOOKAHEAD_BLOCK", "c", "the row still owns the block, and its next round overwrites those slots "
                "with the committed tokens' K and V: a published entry would change under whoever reused it"),
    WrongAnswer("LOOKAHEAD_BLOCK", "d", "greedy drafts are rejected too, and the slots are overwritten all the "
                "same"),
    WrongAnswer("TEMP0_TOKENS", "a", "the verifier is exact in distribution (and greedy verification returns the "
                "target's argmax): no bias makes tokens differ"),
    WrongAnswer("TEMP0_TOKENS", "b", "a published rejected block would be a bug, but it is not what changes "
                "greedy tokens in a batch without a prefix hit"),
    WrongAnswer("TEMP0_TOKENS", "d", "greedy verification ignores the draft's temperature: the target's argmax "
                "decides every token"),
    WrongAnswer("BATCH_128", "a", "a longer K costs more at a compute-bound batch, and the profile says K >= 1 "
                "already loses"),
    WrongAnswer("BATCH_128", "b", "a wider tree scores even more positions per request, which is what the "
                "compute-bound batch cannot afford"),
    WrongAnswer("BATCH_128", "c", "greedy verification changes the output distribution of sampling requests and "
                "saves almost nothing: the cost is in the verify forward"),
    # -- notebook 14: numbers --------------------------------------------------------------------------------
    WrongAnswer("EXPERTS_UNION", 48, "6 tokens x 8 experts counts an expert once per token that picks it; the step "
                "reads each expert once: E (1 - (1 - k/E)^n)"),
    WrongAnswer("EXPERTS_UNION", expected_union(5, 8, 64), "a verify step feeds gamma + 1 tokens (the last committed "
                "token and the 5 drafts), not gamma"),
    WrongAnswer("VERIFY_GB", (2.5e9 + 48 * 8 * 20e6) * 2 / 1e9, "that is a decode step (8 experts per layer); the 5 "
                "tokens route to the union of their experts"),
    WrongAnswer("VERIFY_GB", (2.5e9 + 48 * 40 * 20e6) * 2 / 1e9, "5 tokens x 8 experts counts shared experts twice: "
                "the union is E (1 - (1 - k/E)^n) = 31.2 per layer"),
    WrongAnswer("VERIFY_GB", (2.5e9 + 48 * 64 * 20e6) * 2 / 1e9, "5 tokens do not touch all 64 experts of a layer: "
                "about 31"),
    WrongAnswer("KV_SHARE", 32768 * 131072 / (32768 * 131072 + 8.03e9 * 2), "each of the 16 rows reads its own "
                "cache; only the weights are shared"),
    WrongAnswer("KV_SHARE", 16 * 32768 * 131072 / (8.03e9 * 2), "that is the cache over the weights; the share is "
                "the cache over both"),
    WrongAnswer("TP_DRAFT_MS", 0.3 / 8, "tensor parallelism splits the compute, not the all-reduces: 48 of them "
                "per token at 20 us"),
    WrongAnswer("TP_DRAFT_MS", 0.3 / 8 + 24 * 0.020, "a transformer layer all-reduces twice under tensor "
                "parallelism (after attention and after the MLP)"),
    WrongAnswer("LAYERSKIP_SPEEDUP", (1 - 0.6 ** 5) / 0.4, "that is the tokens per round, E(0.6, 4); divide by the "
                "round's cost in target steps (2)"),
    WrongAnswer("LAYERSKIP_SPEEDUP", (1 - 0.6 ** 5) / 0.4 / 1.75, "verification also runs the first 8 layers on "
                "the last draft, so it reads all 32 layers: 1 step, not 0.75"),
    WrongAnswer("BLOCK_ACCEPTED", 0.75, "3/4 is token-wise verification's; block verification keeps the longest "
                "prefix whose coin passes"),
    WrongAnswer("BLOCK_ACCEPTED", 1.875, "the question asks for accepted drafts, not tokens per round (which add "
                "the extra token)"),
    # -- notebook 14: choices --------------------------------------------------------------------------------
    WrongAnswer("ROLLOUT_TAIL", "a", "the verifier is exact in distribution for any K: K changes the speed, not "
                "the law of the samples"),
    WrongAnswer("ROLLOUT_TAIL", "b", "a small batch is where drafting is cheapest: decoding is memory bound"),
    WrongAnswer("ROLLOUT_TAIL", "d", "determinism does not depend on K being small; exact verification keeps the "
                "law at any K, and bitwise identity needs batch-invariant kernels"),
    WrongAnswer("DISAGG_STATE", "a", "an EAGLE drafter reads the target's hidden states and keeps its own KV: "
                "without them its first drafts are computed from nothing"),
    WrongAnswer("DISAGG_STATE", "c", "drafts are made on the decode side every round; what it lacks is the "
                "drafter's state"),
    WrongAnswer("DISAGG_STATE", "d", "the target's logits are needed only at the last position; the drafter needs "
                "hidden states and its own KV"),
    WrongAnswer("RELAXED_QUALITY", "a", "a relaxed rule raises acceptance by accepting what exact verification "
                "would reject: acceptance cannot measure what it lost"),
    WrongAnswer("RELAXED_QUALITY", "b", "verification only stays exact with the rejection rule; accepting any "
                "top-5 draft changes the output's distribution"),
    WrongAnswer("RELAXED_QUALITY", "d", "speedup says how fast, not how different the outputs are"),
    # -- notebook 15: numbers --------------------------------------------------------------------------------
    WrongAnswer("PARALLEL_GAMMA", 6, "more drafts are not free even in one pass: each adds 0.05 steps of "
                "verification, and the fifth and sixth add fewer tokens than that"),
    WrongAnswer("PARALLEL_GAMMA", 3, "that is where an autoregressive draft would stop; in one pass the fourth draft "
                "still pays"),
    WrongAnswer("STATE_GB", 64 * 36 * 3 * 32 * 128 * 128 * 2 / 1e9, "a verify pass feeds gamma + 1 positions (the "
                "last committed token and 3 drafts): 4 states per row and layer"),
    WrongAnswer("STATE_GB", 64 * 36 * 32 * 128 * 128 * 2 / 1e9, "one state per row and layer is the state without "
                "speculation; keeping one per fed position multiplies it by gamma + 1"),
    WrongAnswer("STATE_GB", 64 * 36 * 4 * 32 * 128 * 128 * 4 / 1e9, "bf16 is 2 bytes per value"),
    WrongAnswer("TAU_AFTER_SHIFT", (1 - 0.8 ** 5) / 0.2, "that is the tau before the update, at alpha 0.8"),
    WrongAnswer("TAU_AFTER_SHIFT", 0.6 * 4, "gamma x alpha counts every draft as if each were tried: a rejection "
                "ends the round, and the round adds one token of the target's: (1 - alpha^(gamma+1)) / (1 - alpha)"),
    WrongAnswer("TAU_AFTER_SHIFT", (1 - 0.6 ** 5) / 0.4 - 1, "accepted drafts, not tokens per round: a round also "
                "commits the target's correction or bonus token"),
    WrongAnswer("COD_TOKENS", 4096, "that keeps every chain: COD drops masks, keeping max(0.7^i, 0.2) of each block"),
    WrongAnswer("COD_TOKENS", 512 + sum(int(512 * 0.7 ** i) for i in range(1, 8)), "the share kept stops falling at "
                "0.2: blocks 5 to 7 keep 102 masks each"),
    WrongAnswer("COD_TOKENS", sum(int(512 * max(0.7 ** i, 0.2)) for i in range(1, 8)), "the 512 real tokens are in "
                "the sequence too"),
    # -- notebook 15: choices --------------------------------------------------------------------------------
    WrongAnswer("MASK_SEES", "a", "a plain causal mask over the sequence lets the mask see real tokens past its "
                "anchor (the answers) and other chains' masks"),
    WrongAnswer("MASK_SEES", "c", "real tokens 8 and 9 are what its chain predicts: at inference it sees the prefix "
                "up to its anchor (9 - 2 = 7) and its chain's masks"),
    WrongAnswer("MASK_SEES", "d", "at inference a mask follows the prefix and its chain's earlier masks; training "
                "must show it the same context"),
    WrongAnswer("WHICH_STATE", "a", "the state after the 4th draft has read drafts 3 and 4, which were rejected"),
    WrongAnswer("WHICH_STATE", "c", "the correction token has not been fed yet: the next round feeds it, from the "
                "state after the 2nd draft"),
    WrongAnswer("WHICH_STATE", "d", "the state from before the round forgets the 3 committed positions unless "
                "they are re-fed"),
    WrongAnswer("STALE_DRAFTER", "a", "a drafter follows a moving target by re-distilling on its outputs: "
                "regenerated data brings acceptance back"),
    WrongAnswer("STALE_DRAFTER", "b", "exact-match verification still needs drafts, and it changes the output's "
                "distribution at temperature > 0"),
    WrongAnswer("STALE_DRAFTER", "d", "tokens per round, and so throughput, fall with acceptance"),
)


def for_question(question: str) -> list[WrongAnswer]:
    """The catalogued wrong answers to one drill question."""
    return [w for w in WRONG_ANSWERS if w.question == question]
