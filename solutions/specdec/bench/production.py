"""Notebook 13's measurements on the course's models: ``python -m specdec.bench.production``.

1. **Agent-like workload** (:mod:`specdec.production.workload`): two-turn sessions that resend their context and
   re-read an edited file. Every request decodes greedily with target-only decoding, prompt lookup (notebook 06),
   suffix decoding (per request and across requests, fed in session order) and the draft model (gamma 4),
   interleaved across repeats; tokens per target forward, speedup over target-only, and every output checked
   equal to target-only decoding.
2. **Prefix caching**: the same requests through the serving engine, prefix caching on and off, speculation on
   (gamma 4) and off: hit rate, prompt tokens computed, outputs equal.
3. **Grammar-constrained speculation**: code prompts continued under a grammar, the draft following it or cut by
   it, greedy and at temperature 1: acceptance (alpha, draft acceptance rate) against the unconstrained run, and
   the greedy output equal to constrained target-only decoding.
4. **Determinism**: 16 greedy requests served in one batch by a bfloat16 split-K model (a GEMM library's
   shape-dependent reduction, :mod:`specdec.production.determinism`) against each served alone by the same engine
   and model, and the same with a batch-invariant reduction.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec.bench.timing import LoadWatch, interleaved, spread
from specdec.engine import speculative_generate, target_only_generate
from specdec.lookup import lookup_generate
from specdec.metrics import alpha_from_counts
from specdec.models import corpus, tokenizer
from specdec.models.checkpoints import load_pair
from specdec.models.model import Llama
from specdec.params import GREEDY, SamplingParams
from specdec.production.determinism import split_k
from specdec.production.grammar import Grammar, Matcher, constrained_generate, constrained_target_only
from specdec.production.suffix import SuffixProposer, proposer_generate
from specdec.production.workload import agent_sessions
from specdec.serving.engine import ServingEngine

#: The grammar of section 3: indented assignments of a name to a call, one per line (a tool-call-like format).
CALL_GRAMMAR = "(    [a-z_]+ = [a-z_]+\\.[a-z_]+\\([a-z_, ]*\\)\n)+"
#: Every byte allowed: the unconstrained run goes through the same code, with masks that forbid nothing.
ANYTHING = "(.|\n)*"


class ForwardCounter:
    """Counts a model's forward calls (one per verification round, or per token without speculation)."""

    def __init__(self, model: Llama) -> None:
        self.calls = 0
        self.handle = model.register_forward_hook(lambda *_: self._count())

    def _count(self) -> None:
        self.calls += 1

    def close(self) -> None:
        self.handle.remove()


def workload(target: Llama, draft: Llama, n_sessions: int, new_tokens: int, repeats: int, progress=print) -> dict:
    sessions = agent_sessions(n_sessions)
    requests: list[tuple[int, list[int]]] = []
    references: list[list[int]] = []
    for session in sessions:  # the prompts of turn 2 carry turn 1's answer: decode turn 1 first
        context: list[int] = []
        for turn in session:
            prompt = context + tokenizer.encode(turn.text)
            answer = target_only_generate(target, prompt, new_tokens)
            requests.append((turn.session, prompt))
            references.append(answer)
            context = prompt + answer

    def run_suffix() -> list[list[int]]:
        proposer, outs = SuffixProposer(depth=24, factor=2.0, min_prob=0.1), []
        for i, (_, prompt) in enumerate(requests):
            proposer.start(i, prompt)
            out = proposer_generate(target, prompt, new_tokens, lambda tokens, i=i: proposer.propose(i, tokens, 8),
                                    on_commit=lambda tokens, i=i: proposer.commit(i, tokens))
            proposer.finish(i, prompt + out)
            outs.append(out)
        return outs

    methods = {
        "target only": lambda: [target_only_generate(target, p, new_tokens) for _, p in requests],
        "prompt lookup": lambda: [lookup_generate(target, p, new_tokens, 8) for _, p in requests],
        "suffix decoding": run_suffix,
        "draft model": lambda: [speculative_generate(target, draft, p, new_tokens, 4) for _, p in requests],
    }
    times: dict[str, list[float]] = {m: [] for m in methods}
    forwards: dict[str, int] = {}
    identical: dict[str, bool] = {}
    for _, name in interleaved(list(methods), repeats):
        counter = ForwardCounter(target)
        start = time.perf_counter()
        outs = methods[name]()
        times[name].append(time.perf_counter() - start)
        counter.close()
        forwards[name] = counter.calls - sum(1 for _, p in requests if len(p) > 1)  # the prefills
        identical[name] = outs == references
    total = len(requests) * new_tokens
    base = spread(times["target only"])["median"]
    rows = []
    for name in methods:
        s = spread(times[name])
        rows.append({"method": name, "seconds": s["median"], "seconds_min": s["min"], "seconds_max": s["max"],
                     "spread": s["spread"], "tokens_per_target_forward": total / max(forwards[name], 1),
                     "speedup": base / s["median"], "identical": identical[name]})
        progress(f"  {name:16s} {rows[-1]['tokens_per_target_forward']:5.2f} tokens per target forward  "
                 f"{rows[-1]['speedup']:5.2f}x  ({s['min']:.1f}-{s['max']:.1f} s)  identical: {identical[name]}")
    prompt_tokens = [len(p) for _, p in requests]
    return {"rows": rows, "requests": len(requests), "new_tokens": new_tokens,
            "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens), "repeats": repeats,
            "spreads": {r["method"]: r["spread"] for r in rows}}


def prefix_caching(target: Llama, draft: Llama, n_sessions: int, new_tokens: int, progress=print) -> dict:
    requests = []
    for session in agent_sessions(n_sessions):
        context: list[int] = []
        for turn in session:
            prompt = context + tokenizer.encode(turn.text)
            requests.append(prompt)
            context = prompt + target_only_generate(target, prompt, new_tokens)
    rows, outputs = [], {}
    for gamma in (0, 4):
        for caching in (False, True):
            engine = ServingEngine(target, draft, num_blocks=400, block_size=16, max_gamma=4, prefix_caching=caching)
            computed = 0
            for i, prompt in enumerate(requests):  # in arrival order: a session's turn 2 after its turn 1
                engine.add_request(prompt, new_tokens, gamma=gamma)
                before = sum(s.target_tokens for s in engine.steps)
                engine.run()
                computed += sum(s.target_tokens for s in engine.steps) - before
            outs = [engine.done[i].output for i in range(len(requests))]
            outputs[(gamma, caching)] = outs
            cache = engine.prefix_cache
            rows.append({"gamma": gamma, "prefix_caching": caching,
                         "hit_rate": cache.hit_rate if cache is not None else 0.0,
                         "target_tokens_computed": computed,
                         "prompt_tokens": sum(len(p) for p in requests),
                         "blocks_published": len(cache.key_of) if cache is not None else 0})
            progress(f"  gamma {gamma}  prefix caching {'on ' if caching else 'off'}  hit rate "
                     f"{rows[-1]['hit_rate']:.2f}  target tokens computed {computed}")
    same = all(outs == outputs[(0, False)] for outs in outputs.values())
    return {"rows": rows, "identical": same}


def grammar_runs(target: Llama, draft: Llama, n_prompts: int, new_tokens: int, progress=print) -> dict:
    grammar, anything = Grammar(CALL_GRAMMAR), Grammar(ANYTHING)
    prompts = [tokenizer.encode(p[: p.rfind("\n") + 1]) for p in corpus.code_prompts(n_prompts)]  # whole lines
    rows = []
    for label, params in (("greedy", GREEDY), ("temperature 1", SamplingParams(temperature=1.0))):
        for mode in ("unconstrained", "draft follows the grammar", "draft cut by the grammar"):
            stats: dict = {}
            outs = []
            generator = torch.Generator().manual_seed(0)
            for prompt in prompts:
                out = constrained_generate(target, draft, prompt, new_tokens,
                                           anything if mode == "unconstrained" else grammar, 4, params, generator,
                                           draft_follows_grammar=mode.startswith("draft follows"), stats=stats)
                outs.append(out)
            row = {"sampling": label, "mode": mode, "rounds": stats["rounds"], "proposed": stats["proposed"],
                   "accepted": stats["accepted"], "cut": stats.get("cut", 0),
                   "draft_acceptance_rate": stats["accepted"] / max(stats["proposed"], 1),
                   "alpha": alpha_from_counts(stats["accepted"], stats["rejections"]),
                   "tau": 1 + stats["accepted"] / max(stats["rounds"], 1)}
            if mode != "unconstrained":
                row["matches_grammar"] = all(Matcher(grammar).validate(out) == len(out) for out in outs)
                if params.temperature == 0:
                    row["identical_to_constrained_target_only"] = outs == [
                        constrained_target_only(target, p, new_tokens, grammar) for p in prompts]
            rows.append(row)
            progress(f"  {label:13s} {mode:26s} tau {row['tau']:.2f}  acceptance rate "
                     f"{row['draft_acceptance_rate']:.2f}  cut {row['cut']}")
    example = constrained_target_only(target, prompts[0], new_tokens, grammar)
    return {"grammar": CALL_GRAMMAR, "rows": rows, "example": tokenizer.decode(example), "prompts": n_prompts,
            "new_tokens": new_tokens}


def _serve(target: Llama, draft: Llama, prompts: list[list[int]], new_tokens: int, gamma: int) -> list[list[int]]:
    """Greedy outputs of ``prompts`` served together in one engine."""
    engine = ServingEngine(target, draft, num_blocks=len(prompts) * 8 + 8, block_size=16, max_gamma=4)
    ids = [engine.add_request(p, new_tokens, gamma=gamma) for p in prompts]
    engine.run()
    return [engine.done[i].output for i in ids]


def determinism(target: Llama, draft: Llama, n_requests: int, new_tokens: int, progress=print) -> dict:
    prompts = [tokenizer.encode(p)[:48] for p in corpus.code_prompts(n_requests, length=80)]
    rows = []
    for invariant in (False, True):
        t, d = split_k(target, batch_invariant=invariant), split_k(draft, batch_invariant=invariant)
        for gamma in (0, 4):
            alone = [_serve(t, d, [p], new_tokens, gamma)[0] for p in prompts]
            outs = _serve(t, d, prompts, new_tokens, gamma)
            differ = [i for i, (a, b) in enumerate(zip(outs, alone)) if a != b]
            first = [next(j for j, (x, y) in enumerate(zip(outs[i], alone[i])) if x != y) for i in differ]
            rows.append({"batch_invariant": invariant, "gamma": gamma, "requests": n_requests,
                         "requests_that_differ": len(differ), "first_differing_token": first})
            progress(f"  {'batch-invariant' if invariant else 'shape-dependent'} split-K, gamma {gamma}: "
                     f"{len(differ)} of {n_requests} requests differ from decoding alone")
    return {"rows": rows, "new_tokens": new_tokens}


def run(repeats: int = 3, progress=print) -> dict:
    torch.set_num_threads(1)
    target, draft = load_pair()
    watch = LoadWatch(1)
    started = time.perf_counter()
    with torch.inference_mode():
        progress("agent-like workload: 8 two-turn sessions, 40 new tokens per request, greedy")
        report = {"workload": workload(target, draft, 8, 40, repeats, progress)}
        watch.sample()
        progress("prefix caching in the serving engine")
        report["prefix_caching"] = prefix_caching(target, draft, 8, 40, progress)
        watch.sample()
        progress("grammar-constrained speculation (gamma 4)")
        report["grammar"] = grammar_runs(target, draft, 6, 48, progress)
        watch.sample()
        progress("determinism: bfloat16 split-K")
        report["determinism"] = determinism(target, draft, 16, 48, progress)
        watch.sample()
    report["machine"] = watch.report(report["workload"]["spreads"])  # prints its warnings
    report["measured_on"] = time.strftime("%Y-%m-%d") + ", 1 CPU thread"
    report["seconds"] = round(time.perf_counter() - started)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the workload (default 3)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/production/production.json"),
                        help="where to write the report (default artifacts/production/production.json)")
    parser.add_argument("--notebook-reference", type=Path, default=None,
                        help="also write notebook 13's copy here (data/bench/nb13_production.json)")
    args = parser.parse_args(argv)
    report = run(args.repeats)
    for path in [args.out] + ([args.notebook_reference] if args.notebook_reference else []):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
