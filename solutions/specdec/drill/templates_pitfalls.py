"""Drill templates of notebook 10 (and the proposer choice of notebooks 06 and 13): symptoms to bugs, what exactness
needs, which proposer fits."""

from __future__ import annotations

import random

from specdec.drill.questions import Choice, choice

NB = "10_pitfalls_interview"

#: Notebook 10's clinic: each bug report (the symptom a user sees) with the bug that causes it.
BUGS = (
    ("With sampling on, outputs are blander than the target's",
     "the draft proposes its argmax but reports its softmax as q"),
    ("Batch size 1 works; batch 8 accepts the wrong tokens",
     "the draft tokens' probabilities are gathered with batch-1 indexing, so every row reads row 0's"),
    ("Very rarely, the output contains a token the target forbids",
     "the accept test compares a float32 uniform with u <= p/q, so u = 0 accepts a token with p = 0"),
    ("The GPU sits idle 30% of the verify step",
     "the accepted prefix is counted with a .item() per position, a host sync each"),
    ("NaN in the sampler, a few times a day",
     "the residual max(p - q, 0) is normalised without a guard for rows where it is all zero (p == q)"),
    ("Sampling at temperature 1 is subtly too repetitive",
     "after a rejection the replacement is sampled from p instead of the residual"),
    ("With speculation on, temperature 1 looks like temperature 0 every few tokens",
     "the bonus token after a full acceptance is taken by argmax instead of sampled from p"),
    ("Latency grows with the length of the conversation",
     "each round recomputes the whole sequence instead of feeding the new tokens to the KV cache"),
    ("The chat shows a few characters after the end of the answer, and some replies run past their length limit",
     "the round's committed tokens are streamed before looking for the stop token and max_tokens"),
)


@choice("pitfalls_symptom_to_bug", topic="pitfalls", notebook=NB, section="Part 1 · The clinic")
def symptom_to_bug(rng: random.Random) -> Choice:
    symptom, bug = rng.choice(BUGS)
    others = rng.sample([b for s, b in BUGS if b != bug], 3)
    return Choice(
        f'Bug report on a speculative decoder: "{symptom}". Which bug is the most likely cause?',
        bug,
        tuple(others),
        f"{symptom}: {bug}. Each bug of notebook 10's clinic gives output that looks fine and is subtly wrong, slow or "
        "rare; the symptom points at the step that owns it.")


@choice("pitfalls_temperatures", topic="pitfalls", notebook=NB, section="Part 2 · The drill")
def temperatures(rng: random.Random) -> Choice:
    request, draft = rng.choice([(0.7, 1.0), (0.5, 0.9), (1.0, 0.6), (0.8, 1.2)])
    return Choice(
        f"A request asks for temperature {request}. The draft samples at temperature {draft} and reports q at {draft} "
        f"(the distribution it really sampled from); the target's p uses {request}. Is the output exact?",
        "yes: the draft's token is distributed as the q handed to the verifier and p is the target under the request's "
        "parameters, so the output follows the target (acceptance may be lower)",
        ("no: draft and target must use the same temperature",
         "only with greedy verification",
         "only if the draft is the target itself"),
        "Exactness needs q to be what the draft sampled from and p the target's distribution under the request's "
        "parameters; the draft's own temperature only changes how often its tokens are accepted. A one-hot q is the "
        "extreme case (greedy or n-gram drafts).")


@choice("pitfalls_proposer_for_copying", topic="lookup", notebook="06_prompt_lookup", section="5. Code against math")
def proposer_for_copying(rng: random.Random) -> Choice:
    task = rng.choice(["edit a file they paste into the prompt", "summarise a document, quoting it at length",
                       "rewrite code they paste, renaming a few variables"])
    return Choice(
        f"Users {task}, so most of the answer copies the prompt. You may not train or serve any extra model. What "
        "do you draft from?",
        "an n-gram lookup in the prompt and output so far (prompt lookup, or suffix decoding), verified as one-hot drafts",
        ("a small draft model of the same family, distilled on the target",
         "Medusa heads trained on the target's own outputs",
         "an EAGLE drafter reading the target's features"),
        "Copying tasks are where lookup pays (Spec-Bench: PLD 2.43x on summarisation): the proposal costs a string "
        "search (c about 0), needs no weights or KV, and stays exact with the one-hot rule. The other three all train "
        "or serve extra weights.")
