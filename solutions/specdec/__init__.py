"""Speculative Decoding course: reference solutions, checks and course machinery.

The notebooks in ``notebooks/`` import from here, so a learner stuck on one notebook can still do
the next. Every module holds one idea; imports only go down (``tests/test_layout.py``).

Terms
-----
One *round* of speculation, as the code names its parts (P committed tokens before the round)::

    committed   tokens that are part of the output: the prompt, then every token verification
                kept. A round commits k accepted drafts and then one token of the target's own,
                so 1 to gamma + 1 tokens.
    draft       a proposed token (``drafts``: the round's gamma proposals); ``q`` is the
                distribution each was drawn from, ``p`` the target's at the same position.
    correction  the target's token at the first rejected position, drawn from the residual
                max(p - q, 0) (greedy: the target's argmax there).
    bonus       the target's token after a full acceptance (all gamma drafts kept), drawn from
                p at position gamma: it costs no extra forward.
    extra       the one target token a round always ends with: the correction or the bonus.
    pending     committed tokens the draft has not fed yet: 1 (the extra token), or 2 after a
                full acceptance (its own last draft, which it never fed, and the bonus).
    lookahead   KV slots reserved for a row's drafts beyond its committed tokens (serving,
                notebook 11); a rejection leaves them to be freed.
    emitted     committed tokens a request returns: cut at its first stop (a stop token, the end
                of a stop sequence, max_tokens), so emitted <= committed.

Acceptance, three ways (never interchangeable)::

    alpha            per-position probability that a draft is accepted given every earlier one
                     was; the cost model's parameter: E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha).
    acceptance rate  accepted drafts / proposed drafts, a measurement (vLLM's draft_acceptance_rate);
                     under the i.i.d. model it is (E - 1) / gamma and falls with gamma at fixed alpha.
    tau              tokens committed per target forward: 1 + accepted / rounds (vLLM's
                     mean_acceptance_length, EAGLE's tau), the extra token included.

``metrics`` computes all three from per-round counts (alpha = A / (A + R), R the rounds ended by a
rejection), per-position rates, and the conversions between them.

Layout
------
- lessons, one module per notebook idea: ``ledger`` (01), ``greedy`` (02), ``rejection`` (03),
  ``chain`` (04), ``engine`` and ``drafts`` (05), ``lookup`` (06), ``tree`` and ``multidraft``
  (07), ``kernels`` (08), ``analysis`` and ``metrics`` (09), ``pitfalls`` and ``buggy_decoder`` (10);
- shared, low: ``params`` (SamplingParams, GREEDY, StopCriteria, request checks), ``sampling``
  (logits to the distribution drawn from), ``validate`` (argument checks), ``paths``, ``tables``;
- ``recording``: the loops run with every forward recorded (SpeculativeEngine, per-round stats);
- ``models/``: the small Llama and KV cache, tokenizer, corpus, toy models, checkpoints, training,
  model card, Hugging Face export and any pretrained model behind the same interface;
- ``serving/``: notebook 11's continuous-batching engine; ``drafters/``: notebook 12's self-drafters;
  ``frontier/``: notebook 14's; ``questions2026/``: notebook 15's (parallel drafting, hybrid targets, drift);
- ``viz/``: plots and notebook 01's simulator; ``bench/``: every benchmark (``python -m specdec.bench``),
  its methods interleaved across repeats, with spreads and busy-machine warnings (``bench.timing``);
- ``course/``: nbgrader driving, release, self-grading, cohort grading;
- ``checks/``: what judges a learner's function; ``mistakes/``: the catalogue of known-wrong answers.
- ``drill/``: self-study interview drill with fresh numbers per seed (``python -m specdec.drill``, ``make drill``,
  ``drill_widget()``); it computes every answer with the lessons' functions and nothing below imports it.

Notebook -> reference modules, its checks and mistakes (``checks.X`` and ``mistakes.X``), its tests
(``tests/test_checks.py`` and ``tests/test_mistakes_in_notebooks.py`` run every notebook's checks against its
mistakes)::

    nb  topic              reference                             X          tests/
    01  cost ledger        ledger, tables, viz.simulator         ledger     test_ledger, test_simulator, test_tables
    02  greedy verify      greedy, models.toy, viz.plots         greedy     test_samplers, test_alternatives
    03  rejection          rejection, sampling                   rejection  test_samplers
    04  chain verify       chain                                 chain      test_samplers, test_alternatives
    05  KV cache, engine   engine, params, recording, drafts,    engine     test_engine, test_model, test_drafts,
                           models.*                                         test_train, test_hf, test_pretrained
    06  prompt lookup      lookup                                lookup     test_lookup
    07  tree attention     tree, multidraft                      tree       test_tree, test_multidraft
    08  GPU kernels        kernels                               kernels    test_kernels, test_alternative_kernels
    09  benchmark          analysis, metrics, bench.speculative  analysis   test_bench, test_metrics
    10  pitfalls           pitfalls, buggy_decoder               pitfalls   test_pitfalls
    11  serving            serving.*, bench.serve                serving    test_serving
    12  self-drafting      drafters.*, bench.drafters,           drafters   test_self_drafting,
                           viz.drafters                                     test_drafter_pictures
    13  production         production.*, serving.prefix_cache,   production test_production,
                           drafters.eagle3, bench.production                test_alternatives_production
    14  frontier           frontier.*, bench.frontier            frontier   test_frontier
    15  parallel, state,   questions2026.*, bench.questions2026  questions2026  test_questions2026
        drift

The pipeline (release in sync, every notebook runs, solutions score full marks, blank skeletons
zero) is ``tests/test_notebooks.py``; grading is ``tests/test_grading.py`` and ``tests/test_cohort.py``.
"""

__version__ = "0.1.0"

from specdec.models.threads import use_course_threads as _use_course_threads

_use_course_threads()  # one torch thread per process by default: see specdec.models.threads
