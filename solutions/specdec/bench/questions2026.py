"""Notebook 15's measurements: parallel against autoregressive drafting by gamma (code and math), the hybrid
target's two rollback strategies, and a drafter's acceptance before and after its target moves.

``python -m specdec.bench.questions2026`` (``make bench-parallel-state-notebook`` writes notebook 15's copy,
``data/bench/nb15_parallel_state_drift.json``). One CPU thread; the wall-clock ratios come from one interleaved run (target-only,
autoregressive and parallel decoding of each prompt one after the other), so a drift in the machine's speed hits
all three alike.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from specdec.bench.timing import LoadWatch
from specdec.engine import target_only_generate
from specdec.models import corpus, tokenizer
from specdec.models.checkpoints import load, load_pair
from specdec.params import GREEDY, SamplingParams
from specdec.paths import DATA_DIR
from specdec.questions2026 import drift, hybrid, ledger, parallel

GAMMAS = (1, 2, 3, 4, 6, 8)


def prompts(task: str, n: int, shifted: bool = False) -> list[list[int]]:
    """Held-out prompts: code from held-out files, math from the prompt seed; ``shifted``: in the moved target's
    style (2-space code, 'Solution:' math)."""
    if task == "code":
        texts = corpus.code_prompts(n, length=120)
        texts = [drift.reindent(t) for t in texts] if shifted else texts
    else:
        texts = corpus.math_prompts(n)
        texts = [t.replace("\nAnswer:", "\nSolution:") for t in texts] if shifted else texts
    return [tokenizer.encode(t) for t in texts]


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


@torch.inference_mode()
def forward_costs(target, draft, drafter, repeats: int = 30, context: int = 150) -> dict:
    """Median seconds, after ``context`` cached positions, of: a target forward over g + 1 new positions
    (verify_s[g]), a parallel drafter's forward over g positions (one fed token and g - 1 masks: parallel_s[g]) and
    an autoregressive draft forward over one position (draft_token_s), interleaved."""
    from specdec.models.model import KVCache

    ids = torch.randint(0, 256, (1, context))
    caches = {id(m): KVCache(m.config) for m in (target, draft, drafter)}
    for model in (target, draft, drafter):
        model(ids, caches[id(model)])
    runs = [("verify", g, target, g + 1) for g in (0,) + GAMMAS] + [("parallel", g, drafter, g) for g in GAMMAS]
    runs.append(("draft", 1, draft, 1))
    samples = {(kind, g): [] for kind, g, _, _ in runs}
    for _ in range(repeats):
        for kind, g, model, width in runs:
            cache = caches[id(model)]
            start = time.perf_counter()
            model(torch.randint(0, 256, (1, width)), cache)
            samples[(kind, g)].append(time.perf_counter() - start)
            cache.crop(context)
    median = lambda xs: sorted(xs)[len(xs) // 2]
    return {"verify_s": {g: median(samples[("verify", g)]) for g in (0,) + GAMMAS},
            "parallel_s": {g: median(samples[("parallel", g)]) for g in GAMMAS},
            "draft_token_s": median(samples[("draft", 1)])}


def parallel_report(target, draft, drafter, n_prompts: int, n_tokens: int, watch: LoadWatch) -> dict:
    """For each task and gamma: tau (tokens per round), rounds, acceptance by position and the wall-clock speedup
    over target-only decoding of both proposers, from one interleaved run; the costs the run itself measured (seconds
    of drafting and of verification per round, of target-only decoding per token); and the ledger's best gamma from
    those costs and the alphas measured at gamma 8, beside the measured best."""
    out = {"costs": forward_costs(target, draft, drafter)}
    for task in ("code", "math"):
        rows = {}
        base_s = 0.0
        acc = {(kind, g): {"accepted": [], "proposed": [], "seconds": 0.0, "draft_s": 0.0, "verify_s": 0.0,
                           "identical": True}
               for kind in ("autoregressive", "parallel") for g in GAMMAS}
        for prompt in prompts(task, n_prompts):
            want, seconds = _timed(target_only_generate, target, prompt, n_tokens)
            base_s += seconds
            for g in GAMMAS:
                for kind, proposer in (("autoregressive", parallel.AutoregressiveProposer(draft)),
                                       ("parallel", parallel.ParallelProposer(drafter))):
                    (tokens, stats), seconds = _timed(parallel.speculative_with_stats, target, proposer, prompt,
                                                      n_tokens, g)
                    entry = acc[(kind, g)]
                    entry["accepted"] += stats["accepted"]
                    entry["proposed"] += stats["proposed"]
                    entry["seconds"] += seconds
                    entry["draft_s"] += stats["draft_s"]
                    entry["verify_s"] += stats["verify_s"]
                    entry["identical"] &= tokens == want
            watch.sample()
        per_token = base_s / (n_prompts * n_tokens)
        for (kind, g), entry in acc.items():
            rounds = len(entry["accepted"])
            rows[f"{kind}_{g}"] = {
                "proposer": kind, "gamma": g, "rounds": rounds,
                "tau": round((sum(entry["accepted"]) + rounds) / rounds, 4),
                "alphas": [None if math.isnan(a) else round(a, 4)
                           for a in ledger.acceptance_by_position(entry["accepted"], entry["proposed"])],
                "speedup": round(base_s / entry["seconds"], 4), "identical_to_target": entry["identical"],
                "draft_ms_per_round": round(1e3 * entry["draft_s"] / rounds, 4),
                "verify_ms_per_round": round(1e3 * (entry["seconds"] - entry["draft_s"]) / rounds, 4)}
        for kind in ("autoregressive", "parallel"):
            alphas = [a if a is not None else 0.0 for a in rows[f"{kind}_{max(GAMMAS)}"]["alphas"]]
            draft_cost = ledger.cost_from_measurements({g: rows[f"{kind}_{g}"]["draft_ms_per_round"] for g in GAMMAS})
            verify = ledger.cost_from_measurements({0: 1e3 * per_token} | {g: rows[f"{kind}_{g}"]["verify_ms_per_round"]
                                                           for g in GAMMAS})
            predicted = ledger.best_gamma_by_position(alphas, draft_cost, verify)
            measured = max(GAMMAS, key=lambda g: rows[f"{kind}_{g}"]["speedup"])
            rows[f"{kind}_best"] = {"predicted_gamma": predicted[0], "predicted_speedup": round(predicted[1], 4),
                                    "measured_gamma": measured,
                                    "measured_speedup": rows[f"{kind}_{measured}"]["speedup"]}
        rows["target_only_ms_per_token"] = round(1e3 * per_token, 4)
        out[task] = rows
    return out


def hybrid_report(target_h, draft, n_prompts: int, n_tokens: int, gamma: int, watch: LoadWatch) -> dict:
    """The hybrid target with the course draft: acceptance, and the per-position and recomputing strategies side by
    side (identical outputs, wall-clock, state memory, positions re-fed)."""
    config = target_h.config
    out = {"config": config.to_dict(), "params": target_h.num_params(), "gamma": gamma,
           "state_bytes_fp32": {"per_position": hybrid.recurrent_state_bytes(config, 1, gamma, 4),
                                "checkpoint": hybrid.recurrent_state_bytes(config, 1, gamma, 4, per_position=False)}}
    for task in ("code", "math"):
        totals = {"target_only_s": 0.0, "per_position_s": 0.0, "recompute_s": 0.0, "refed": 0, "tokens": 0,
                  "rounds": 0, "identical": True}
        forwards = []
        hook = target_h.register_forward_hook(lambda *a: forwards.append(1))
        for prompt in prompts(task, n_prompts):
            want, s0 = _timed(hybrid.hybrid_target_only_generate, target_h, prompt, n_tokens)
            forwards.clear()
            got, s1 = _timed(hybrid.hybrid_speculative_generate, target_h, draft, prompt, n_tokens, gamma)
            totals["rounds"] += len(forwards) - (len(prompt) > 1)  # its target forwards, less the prefill
            (again, refed), s2 = _timed(hybrid.hybrid_speculative_generate_recomputing, target_h, draft, prompt,
                                        n_tokens, gamma)
            totals["target_only_s"] += s0
            totals["per_position_s"] += s1
            totals["recompute_s"] += s2
            totals["refed"] += refed
            totals["tokens"] += n_tokens
            totals["identical"] &= got == want == again
            watch.sample()
        hook.remove()
        out[task] = {"speedup_per_position": round(totals["target_only_s"] / totals["per_position_s"], 4),
                     "speedup_recompute": round(totals["target_only_s"] / totals["recompute_s"], 4),
                     "refed_per_token": round(totals["refed"] / totals["tokens"], 4),
                     "tokens_per_round": round(totals["tokens"] / totals["rounds"], 4),
                     "identical_to_target": totals["identical"]}
    return out


@torch.inference_mode()
def acceptance(target, draft, prompt_sets: list[list[int]], n_tokens: int, gamma: int, params: SamplingParams,
               seed: int = 0) -> dict:
    """Accepted / proposed drafts and tokens per round over the prompts."""
    g = torch.Generator().manual_seed(seed)
    accepted = proposed = rounds = 0
    for prompt in prompt_sets:
        _, stats = parallel.speculative_with_stats(target, parallel.AutoregressiveProposer(draft), prompt, n_tokens,
                                                   gamma, params, g)
        accepted += sum(stats["accepted"])
        proposed += sum(stats["proposed"])
        rounds += len(stats["accepted"])
    return {"acceptance": round(accepted / proposed, 4), "tau": round((accepted + rounds) / rounds, 4)}


def drift_report(n_prompts: int, n_tokens: int, gamma: int, watch: LoadWatch) -> dict:
    target, draft = load_pair()
    moved = drift.moved_target()
    redistilled = load(DATA_DIR / "models" / "draft_redistilled.safetensors")
    pairs = {"target + draft": (target, draft), "moved target + draft": (moved, draft),
             "moved target + re-distilled draft": (moved, redistilled),
             "target + re-distilled draft": (target, redistilled)}
    out = {"gamma": gamma, "n_tokens": n_tokens, "prompts_per_task": n_prompts}
    for style in ("original", "shifted"):
        sets = prompts("code", n_prompts, style == "shifted") + prompts("math", n_prompts, style == "shifted")
        for name, (t, d) in pairs.items():
            out[f"{name} | {style}"] = {"greedy": acceptance(t, d, sets, n_tokens, gamma, GREEDY),
                                        "t=1": acceptance(t, d, sets, n_tokens, gamma, SamplingParams(1.0))}
            watch.sample()
    prompt = prompts("math", 1, shifted=True)[0]
    worst = 0.0
    for temperature, params in ((None, GREEDY), (None, SamplingParams(1.0)), (0.7, SamplingParams(0.7))):
        tokens, logprobs = drift.speculative_with_logprobs(moved, redistilled, prompt, 64, gamma, params,
                                                           torch.Generator().manual_seed(1), temperature=temperature)
        plain = drift.target_only_logprobs(moved, prompt, tokens, temperature)
        worst = max(worst, max(abs(a - b) for a, b in zip(logprobs, plain)))
    out["logprob_max_abs_difference"] = worst
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6, help="prompts per task")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("artifacts") / "questions2026" / "nb15_parallel_state_drift.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    watch = LoadWatch(threads=1)
    watch.sample()
    target, draft = load_pair()
    drafter = load(DATA_DIR / "models" / "parallel_drafter.safetensors")
    started = time.perf_counter()
    report = {"parallel": parallel_report(target, draft, drafter, args.prompts, args.tokens, watch),
              "hybrid": hybrid_report(hybrid.load_hybrid(), draft, args.prompts, args.tokens, 4, watch),
              "drift": drift_report(args.prompts, args.tokens, 4, watch)}
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["machine"] = watch.report({})
    report["settings"] = {"prompts_per_task": args.prompts, "tokens": args.tokens, "greedy": True,
                          "torch": torch.__version__}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1)[:4000])
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
