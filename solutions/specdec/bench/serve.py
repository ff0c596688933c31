"""Load benchmark of the serving engine (notebook 11): throughput and latency against concurrency,
with speculation off, on (fixed gamma) and adaptive, on the course's target and draft.

A bounded, seeded stream of requests (code and math prompts, greedy and sampled, a stop
string) is served with ``concurrency`` requests in flight: a closed loop by default (a new
request joins as soon as one finishes), or Poisson arrivals at ``--rate`` requests per
second, capped at ``concurrency`` in flight. Only the in-process engine is measured.

The crossover experiment (:func:`decode_sweep`, the report's top level) decodes B requests as one batch,
timed while the batch is full, at batch sizes 1-128: the case the batch cost model describes, with a workload
(short prompts, temperature 1) in which speculation measurably stops paying on this CPU.

    python -m specdec.bench.serve                        # artifacts/serve/serve.{json,csv,png}, crossover.png
    python -m specdec.bench.serve --notebook-reference data/bench/nb11_serve.json
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdec.bench.timing import LoadWatch, interleaved, median_interval, spread
from specdec.ledger import expected_tokens_per_round
from specdec.metrics import alpha_from_counts
from specdec.models import corpus, tokenizer
from specdec.models.model import Llama
from specdec.params import GREEDY, SamplingParams
from specdec.paths import DATA_DIR
from specdec.serving.adaptive import BatchCosts, GoodputGate
from specdec.serving.blocks import blocks_for
from specdec.serving.engine import ServingEngine

MODES = {"off": 0, "on": 4, "auto": "auto"}  # gamma per request
# The crossover experiment's workload: short prompts keep attention cheap beside the matmuls, and sampling at
# temperature 1 on code keeps alpha near 0.86, so the batch at which a verify forward costs more than speculation
# saves falls inside the sweep on this CPU (with alpha 0.94 it lies beyond 256 requests).
CROSSOVER_TASK, CROSSOVER_PROMPT, CROSSOVER_PARAMS = "code", 16, SamplingParams(temperature=1.0)
SETTINGS = (GREEDY, GREEDY, SamplingParams(temperature=0.7, top_p=0.95), SamplingParams(temperature=1.0, top_k=20))


@dataclass(frozen=True)
class Job:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    seed: int


def request_stream(n: int, max_tokens: int, seed: int = 0, task: str = "mixed") -> list[Job]:
    """n requests alternating code and math prompts (or only ``task``'s), with mixed sampling settings, seeded."""
    if task not in ("mixed", "code", "math"):
        raise ValueError(f"task must be 'mixed', 'code' or 'math', got {task!r}")
    rng = random.Random(seed)
    code, math = corpus.code_prompts(n), corpus.math_prompts(n)
    jobs = []
    for i in range(n):
        prompts = code if task == "code" or (task == "mixed" and i % 2 == 0) else math
        text = prompts[(i // 2) % len(prompts)]
        jobs.append(Job(tokenizer.encode(text), SETTINGS[rng.randrange(len(SETTINGS))], max_tokens, seed * 100_003 + i))
    return jobs


def serve(engine: ServingEngine, jobs: list[Job], gamma: int | str, concurrency: int, rate: float | None = None,
          seed: int = 0) -> dict:
    """Serve every job with at most ``concurrency`` in flight; per-request latencies and totals."""
    rng = random.Random(seed)
    arrivals, clock = [], 0.0
    for _ in jobs:
        clock += rng.expovariate(rate) if rate else 0.0
        arrivals.append(clock)
    start = time.perf_counter()
    queue = list(zip(arrivals, jobs))
    ids = []
    while queue or engine.has_unfinished():
        now = time.perf_counter() - start
        while queue and queue[0][0] <= now and len(engine.waiting) + len(engine.running) < concurrency:
            arrival, job = queue.pop(0)
            ids.append(engine.add_request(job.prompt, job.max_tokens, job.params, stop="\n\n", gamma=gamma,
                                          seed=job.seed, arrival_time=start + max(arrival, 0.0) if rate else None))
        if engine.has_unfinished():
            engine.step()
        elif queue:
            time.sleep(max(queue[0][0] - (time.perf_counter() - start), 0.0))
    wall = time.perf_counter() - start
    seqs = [engine.done[i] for i in ids]
    tokens = sum(len(s.output) for s in seqs)
    ttft = [s.first_token_time - s.arrival_time for s in seqs]
    tpot = [(s.finish_time - s.first_token_time) / (len(s.output) - 1) for s in seqs if len(s.output) > 1]
    accepted, proposed = sum(s.accepted for s in seqs), sum(s.proposed for s in seqs)
    rejections, rounds = sum(s.rejections for s in seqs), sum(s.proposed > 0 for s in seqs)
    steps = engine.steps
    return {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
            "ttft_mean_s": statistics.fmean(ttft), "ttft_p90_s": _quantile(ttft, 0.9),
            "tpot_mean_s": statistics.fmean(tpot), "tpot_p90_s": _quantile(tpot, 0.9),
            # acceptance in two of its forms (specdec.metrics): per position, and accepted / proposed
            "alpha": alpha_from_counts(accepted, rejections) if proposed else None,
            "draft_acceptance_rate": accepted / proposed if proposed else None,
            "mean_gamma": sum(s.drafts for s in steps) / max(sum(s.decoding_rows for s in steps), 1),
            "speculating_steps": sum(s.speculating_rows > 0 for s in steps) / max(len(steps), 1),
            "overhead_s": engine.overheads,
            "preemptions": sum(s.preemptions for s in seqs), "requests": len(seqs), "speculating_requests": rounds}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def sweep(target: Llama, draft: Llama, levels: list[int], requests_per_level: int, max_tokens: int,
          rate: float | None = None, seed: int = 0, repeats: int = 3, progress=print) -> dict:
    """Every mode at every concurrency level, ``repeats`` times with the modes interleaved (the order rotated
    each repeat, :func:`specdec.bench.timing.interleaved`): per level and mode the median tokens/s with its min
    and max; the measured step costs; the cost model's prediction; the machine's load and warnings."""
    probe = ServingEngine(target, draft)
    costs = probe.measure_costs(rows=sorted(set(levels) | {1, 2}))  # the batch sizes swept, as decode_sweep does
    watch = LoadWatch(torch.get_num_threads())
    rows, paired = [], []
    for level in levels:
        jobs = request_stream(max(requests_per_level, 2 * level), max_tokens, seed)
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for _, mode in interleaved(list(MODES), repeats):
            engine = ServingEngine(target, draft, num_blocks=4096, block_size=16, token_budget=1024, max_gamma=8,
                                   costs=costs)
            runs[mode].append(serve(engine, jobs, MODES[mode], level, rate, seed))
        watch.sample()
        paired.append(auto_against_best(level, runs))
        progress(f"  concurrency {level:3d}  auto / the better of on and off, paired by repeat: "
                 f"{paired[-1]['auto_over_best']:.3f} (90% interval {paired[-1]['best_interval'][0]:.3f}-"
                 f"{paired[-1]['best_interval'][1]:.3f}; first repeat, the gate new to this batch: "
                 f"{paired[-1]['first_over_best']:.3f})")
        for mode, results in runs.items():
            times = spread([r["seconds"] for r in results])
            middle = min(results, key=lambda r: abs(r["seconds"] - times["median"]))  # latencies of the median run
            tokens = middle["tokens"]
            rows.append({"concurrency": level, "mode": mode, **middle, "tokens_per_s": tokens / times["median"],
                         "tokens_per_s_min": tokens / times["max"], "tokens_per_s_max": tokens / times["min"],
                         "spread": times["spread"], "repeats": len(results)})
            r = rows[-1]
            progress(f"  concurrency {level:3d}  speculation {mode:4s}  {r['tokens_per_s']:7.0f} tokens/s "
                     f"({r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f})  TTFT {r['ttft_mean_s'] * 1e3:6.0f} ms  "
                     f"TPOT {r['tpot_mean_s'] * 1e3:5.1f} ms"
                     + (f"  alpha {r['alpha']:.2f}" if r["alpha"] is not None else ""))
    on = [r for r in rows if r["mode"] == "on"]
    alpha = sum(r["alpha"] * r["tokens"] for r in on) / sum(r["tokens"] for r in on)
    machine = watch.report({f"{r['mode']} at {r['concurrency']}": r["spread"] for r in rows})
    prediction = predicted_speedups(alpha, costs, levels, MODES["on"], rows)
    return {"rows": rows, "auto_vs_best": paired, "costs": {"target": costs[0].to_dict(), "draft": costs[1].to_dict()},
            "alpha_on": alpha, "prediction": prediction, "machine": machine,
            "crossover": {"on": crossover(rows, "on"), "auto": crossover(rows, "auto"),
                          "predicted": next((p["batch"] for p in prediction if p["fixed"] <= 1), None)},
            "config": {"levels": levels, "requests_per_level": requests_per_level, "max_tokens": max_tokens,
                       "rate": rate, "seed": seed, "repeats": repeats, "threads": torch.get_num_threads()}}


def decode_phase(engine: ServingEngine, jobs: list[Job], gamma: int | str) -> dict:
    """All ``jobs`` in one batch: prefill them (not timed), then time decoding while every row is still in the
    batch, from the step after the last first token to the step in which the first request finishes. The batch
    the cost model describes: B rows decoding side by side, no prefill mixed in, no stragglers' tail."""
    for job in jobs:
        engine.add_request(job.prompt, job.max_tokens, job.params, gamma=gamma, seed=job.seed)
    while engine.waiting or any(s.first_token_time is None for s in engine.running):
        engine.step()
    before = sum(len(s.output) for s in engine.running)
    first_step, start = len(engine.steps), time.perf_counter()
    while not engine.done:
        engine.step()
    wall = time.perf_counter() - start
    seqs = [s for s in engine.running] + list(engine.done.values())
    tokens = sum(len(s.output) for s in seqs) - before
    accepted, proposed, rejections = (sum(getattr(s, k) for s in seqs) for k in ("accepted", "proposed", "rejections"))
    steps = engine.steps[first_step:]
    target_costs, draft_costs = engine.costs
    forwards = sum(target_costs(s.rows, s.target_tokens / s.rows) + s.max_gamma * draft_costs(s.speculating_rows, 1)
                   for s in steps if s.rows)
    engine.run()  # the rest, untimed: frees every block
    return {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall, "steps": len(steps),
            "alpha": alpha_from_counts(accepted, rejections) if proposed else None,
            "draft_acceptance_rate": accepted / proposed if proposed else None,
            "mean_gamma": sum(s.drafts for s in steps) / max(sum(s.decoding_rows for s in steps), 1),
            # the time outside the forwards' measured costs, per step of the window (Python, sampling, verification)
            "outside_s": (wall - forwards) / max(len(steps), 1), "overhead_s": engine.overheads}


def decode_sweep(target: Llama, draft: Llama, levels: list[int], prompt_tokens: int = 16, max_tokens: int = 96,
                 params: SamplingParams | None = None, task: str = "mixed", seed: int = 0, repeats: int = 3,
                 progress=print) -> dict:
    """The crossover experiment: at each level, that many requests (``prompt_tokens``-token prompts, mixed
    sampling settings, exactly ``max_tokens`` new tokens each, no stop string) decode as one batch, with speculation
    off, on (gamma 4) and auto, interleaved ``repeats`` times (median, min-max), and up to 16 times below a batch
    of 16, whose runs last a second or two each (``48 // level``: every median rests on about ten seconds of
    decoding or more). The forward costs are measured at
    the batch's mean context, over the same batch sizes, so the cost model's prediction and "auto" see the costs
    this workload pays. Short prompts keep attention cheap beside the weights' matmuls: the regime in which a
    batch turns a forward compute bound and speculation stops paying."""
    context = prompt_tokens + max_tokens // 2
    probe = ServingEngine(target, draft)
    costs = probe.measure_costs(rows=sorted(set(levels) | {1, 2}), context=context)
    watch = LoadWatch(torch.get_num_threads())
    gate = GoodputGate()  # the server's: each new engine goes on from what "auto" measured in the ones before it
    budget = max(levels) * (MODES["on"] + 1) * 2
    blocks = max(levels) * blocks_for(prompt_tokens + max_tokens + 8, 16) + 8
    rows, paired = [], []
    for level in levels:
        jobs = [Job(job.prompt[:prompt_tokens], params or job.params, max_tokens, job.seed)
                for job in request_stream(level, max_tokens, seed, task)]
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for _, mode in interleaved(list(MODES), max(repeats, min(16, 48 // level))):
            engine = ServingEngine(target, draft, num_blocks=blocks, block_size=16, token_budget=budget, max_gamma=8,
                                   costs=costs, gate=gate)
            runs[mode].append(decode_phase(engine, jobs, MODES[mode]))
        watch.sample()
        paired.append(auto_against_best(level, runs))
        progress(f"  batch {level:3d}  auto / the better of on and off, paired by repeat: "
                 f"{paired[-1]['auto_over_best']:.3f} (90% interval {paired[-1]['best_interval'][0]:.3f}-"
                 f"{paired[-1]['best_interval'][1]:.3f}; first repeat, the gate new to this batch: "
                 f"{paired[-1]['first_over_best']:.3f})")
        for mode, results in runs.items():
            times = spread([r["seconds"] for r in results])
            middle = min(results, key=lambda r: abs(r["seconds"] - times["median"]))
            tokens = middle["tokens"]
            rows.append({"concurrency": level, "mode": mode, **middle, "tokens_per_s": tokens / times["median"],
                         "tokens_per_s_min": tokens / times["max"], "tokens_per_s_max": tokens / times["min"],
                         "spread": times["spread"], "repeats": len(results)})
            r = rows[-1]
            progress(f"  batch {level:3d}  speculation {mode:4s}  {r['tokens_per_s']:7.0f} tokens/s "
                     f"({r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f})  drafts/row {r['mean_gamma']:.2f}"
                     + (f"  alpha {r['alpha']:.2f}" if r["alpha"] is not None else ""))
    on = [r for r in rows if r["mode"] == "on"]
    alpha = sum(r["alpha"] * r["tokens"] for r in on) / sum(r["tokens"] for r in on)
    machine = watch.report({f"{r['mode']} at {r['concurrency']}": r["spread"] for r in rows})
    # the cost model with the time outside the forwards measured in the same steps: plain steps' for gamma 0,
    # gamma 4's for speculation (its draft forwards' share included)
    outside = [{"concurrency": r["concurrency"], "mode": r["mode"],
                "overhead_s": {"plain_step": r["outside_s"], "verify_step": r["outside_s"], "draft_forward": 0.0}}
               for r in rows]
    prediction = predicted_speedups(alpha, costs, levels, MODES["on"], outside)
    forwards_only = predicted_speedups(alpha, costs, levels, MODES["on"])
    for p, q in zip(prediction, forwards_only):
        p["fixed_forwards_only"] = q["fixed"]
    return {"rows": rows, "auto_vs_best": paired, "costs": {"target": costs[0].to_dict(), "draft": costs[1].to_dict()},
            "alpha_on": alpha, "prediction": prediction, "machine": machine,
            "crossover": {"on": crossover(rows, "on"), "auto": crossover(rows, "auto"),
                          "predicted": next((p["batch"] for p in prediction if p["fixed"] <= 1), None),
                          "predicted_forwards_only": next((p["batch"] for p in forwards_only if p["fixed"] <= 1), None)},
            "config": {"levels": levels, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens, "context": context,
                       "task": task, "params": asdict(params) if params else "mixed (as the closed-loop stream)",
                       "seed": seed, "repeats": repeats, "threads": torch.get_num_threads()}}


def predicted_speedups(alpha: float, costs: tuple[BatchCosts, BatchCosts], levels: list[int], gamma: int,
                       rows: list[dict] | None = None) -> list[dict]:
    """Notebook 01's batch model with the measured forward costs: speculation's throughput over plain
    decoding at each batch size, for a fixed gamma and for the best gamma (0 when nothing beats plain).
    With ``rows`` (a sweep's), each level also pays the time outside the forwards that its engines measured
    (per target step and per draft forward, the "on" run's for gamma > 0 and the "off" run's for plain decoding):
    the serving form of notebook 09's per-round cost c0."""
    step, draft = costs
    overhead = {(r["concurrency"], r["mode"]): r["overhead_s"] for r in rows or []}
    none = {"plain_step": 0.0, "verify_step": 0.0, "draft_forward": 0.0}
    out = []
    for batch in levels:
        on, off = overhead.get((batch, "on"), none), overhead.get((batch, "off"), none)

        def rate(g: int) -> float:
            extra = on if g else off
            seconds = (g * (draft(batch, 1) + extra["draft_forward"]) + step(batch, g + 1)
                       + extra["verify_step" if g else "plain_step"])
            return batch * expected_tokens_per_round(alpha, g) / seconds

        best = max(range(9), key=lambda g: (rate(g), -g))
        out.append({"batch": batch, "fixed": rate(gamma) / rate(0), "best": rate(best) / rate(0), "best_gamma": best})
    return out


def crossover(rows: list[dict], mode: str = "on") -> int | None:
    """The smallest concurrency at which ``mode`` is no faster than speculation off."""
    off = {r["concurrency"]: r["tokens_per_s"] for r in rows if r["mode"] == "off"}
    for r in sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["concurrency"]):
        if r["tokens_per_s"] <= off[r["concurrency"]]:
            return r["concurrency"]
    return None


def auto_against_best(level: int, runs: dict[str, list[dict]]) -> dict:
    """"auto" against the better of on and off at one level, paired by repeat: in each repeat of the interleaving,
    auto's tokens/s over on's and over off's from the same repeat (a slow stretch of the machine slows the three
    alike), the median over repeats; "auto_over_best" is the smaller of the two, against the mode auto trails more.
    "best_interval": a 90% interval for that median (:func:`median_interval`), what the machine's noise leaves of
    it. "first_over_best": the same from the first repeat alone, in which the gate met this batch size for the
    first time (one repeat: as noisy as a single measurement)."""
    per_repeat = {mode: [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs["auto"], runs[mode])]
                  for mode in ("on", "off")}
    ratios = {mode: statistics.median(values) for mode, values in per_repeat.items()}
    trails = min(ratios, key=ratios.get)
    return {"concurrency": level, "auto_over_on": ratios["on"], "auto_over_off": ratios["off"],
            "auto_over_best": ratios[trails], "best_interval": median_interval(per_repeat[trails]),
            "per_repeat": per_repeat, "first_over_best": min(values[0] for values in per_repeat.values())}


def plot(report: dict, path: Path | None = None):
    import matplotlib.pyplot as plt

    rows, colors = report["rows"], {"off": "tab:gray", "on": "tab:blue", "auto": "tab:green"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for mode, color in colors.items():
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["concurrency"])
        x = [r["concurrency"] for r in mine]
        y = [r["tokens_per_s"] for r in mine]
        low = [r.get("tokens_per_s_min", v) for r, v in zip(mine, y)]
        high = [r.get("tokens_per_s_max", v) for r, v in zip(mine, y)]
        axes[0].errorbar(x, y, yerr=[[v - lo for v, lo in zip(y, low)], [hi - v for v, hi in zip(y, high)]], fmt="o-",
                         color=color, capsize=2, label=f"speculation {mode} (median, min-max)")
        axes[1].plot(x, [r["tpot_mean_s"] * 1e3 for r in mine], "o-", color=color, label=f"TPOT, {mode}")
        axes[1].plot(x, [r["ttft_mean_s"] * 1e3 for r in mine], "x:", color=color, label=f"TTFT, {mode}")
        if mode != "off":
            off = {r["concurrency"]: r["tokens_per_s"] for r in rows if r["mode"] == "off"}
            axes[2].plot(x, [r["tokens_per_s"] / off[r["concurrency"]] for r in mine], "o-", color=color,
                         label=f"measured, {mode}")
    pred = report["prediction"]
    axes[2].plot([p["batch"] for p in pred], [p["fixed"] for p in pred], "--", color="tab:blue",
                 label=f"cost model, gamma {MODES['on']}")
    axes[2].plot([p["batch"] for p in pred], [p["best"] for p in pred], "--", color="tab:green", label="cost model, best gamma")
    axes[2].axhline(1.0, color="lightgray", lw=1)
    for ax, title, ylabel in zip(axes, ("throughput", "latency per request", "speculation / off"),
                                 ("output tokens/s", "ms", "throughput ratio")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=90)
    return fig


def plot_crossover(report: dict, path: Path | None = None):
    """The crossover experiment (:func:`decode_sweep`): throughput per mode, and speculation / off against the
    cost model's prediction."""
    import matplotlib.pyplot as plt

    rows, colors = report["rows"], {"off": "tab:gray", "on": "tab:blue", "auto": "tab:green"}
    off = {r["concurrency"]: r["tokens_per_s"] for r in rows if r["mode"] == "off"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for mode, color in colors.items():
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["concurrency"])
        x, y = [r["concurrency"] for r in mine], [r["tokens_per_s"] for r in mine]
        err = [[v - r["tokens_per_s_min"] for r, v in zip(mine, y)], [r["tokens_per_s_max"] - v for r, v in zip(mine, y)]]
        axes[0].errorbar(x, y, yerr=err, fmt="o-", color=color, capsize=2, label=f"speculation {mode} (median, min-max)")
        if mode != "off":
            axes[1].plot(x, [v / off[b] for b, v in zip(x, y)], "o-", color=color, label=f"measured, {mode}")
    pred = report["prediction"]
    axes[1].plot([p["batch"] for p in pred], [p["fixed"] for p in pred], "--", color="tab:blue",
                 label=f"cost model, gamma {MODES['on']}")
    axes[1].plot([p["batch"] for p in pred], [p["best"] for p in pred], "--", color="tab:green", label="cost model, best gamma")
    axes[1].axhline(1.0, color="lightgray", lw=1)
    for ax, title, ylabel in zip(axes, ("decode throughput", "speculation / off"), ("output tokens/s", "throughput ratio")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests decoding in one batch")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=90)
    return fig


def main(argv: list[str] | None = None) -> int:
    from specdec.models.checkpoints import load_pair

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DATA_DIR / "models")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                        help="levels of the closed-loop stream")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128],
                        help="batch sizes of the crossover experiment (short prompts, temperature 1, code)")
    parser.add_argument("--requests", type=int, default=16, help="requests per level (at least 2x the concurrency)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each mode per level, interleaved (median kept)")
    parser.add_argument("--batch-repeats", type=int, default=8,
                        help="the same for the crossover experiment (more below a batch of 16)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second (default: closed loop)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier timings)")
    parser.add_argument("--out", type=Path, default=Path("artifacts") / "serve")
    parser.add_argument("--notebook-reference", type=Path, metavar="JSON", help="write the report here instead (for notebook 11)")
    args = parser.parse_args(argv)
    for name in ("requests", "max_tokens", "threads", "repeats", "batch_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if min(args.concurrency) < 1 or min(args.batches) < 1 or (args.rate is not None and args.rate <= 0):
        parser.error("concurrency levels, batch sizes and --rate must be positive")
    torch.set_num_threads(args.threads)
    try:
        target, draft = load_pair(args.models)
    except (FileNotFoundError, ValueError) as error:
        print(f"bench_serve: {error}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    print(f"crossover experiment: batches {args.batches} of {CROSSOVER_TASK} prompts cut to {CROSSOVER_PROMPT} tokens, "
          f"temperature {CROSSOVER_PARAMS.temperature}, speculation off / on (gamma {MODES['on']}) / auto")
    report = decode_sweep(target, draft, sorted(args.batches), CROSSOVER_PROMPT, params=CROSSOVER_PARAMS,
                          task=CROSSOVER_TASK, seed=args.seed, repeats=args.batch_repeats)
    print(f"serving load sweep: concurrency {args.concurrency}, speculation off / on (gamma {MODES['on']}) / auto")
    report["closed_loop"] = sweep(target, draft, sorted(args.concurrency), args.requests, args.max_tokens, args.rate,
                                  args.seed, args.repeats)
    report["measured_on"] = f"{time.strftime('%Y-%m-%d')}, {args.threads} CPU thread(s)"
    report["seconds"] = round(time.perf_counter() - start)
    if args.notebook_reference:
        args.notebook_reference.parent.mkdir(parents=True, exist_ok=True)
        args.notebook_reference.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.notebook_reference} in {report['seconds']} s")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve.json").write_text(json.dumps(report, indent=1) + "\n")
    with open(args.out / "serve.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(report["closed_loop"]["rows"][0]))
        writer.writeheader()
        writer.writerows(report["closed_loop"]["rows"])
    plot(report["closed_loop"], args.out / "serve.png")
    plot_crossover(report, args.out / "crossover.png")
    for name, part in (("crossover experiment, batch", report), ("closed loop, concurrency", report["closed_loop"])):
        print(f"auto / the better of on and off ({name}, paired by repeat): "
              + ", ".join(f"{p['concurrency']}: {p['auto_over_best']:.3f}" for p in part["auto_vs_best"]))
    print(f"crossover (speculation no longer faster): gamma {MODES['on']} at a batch of {report['crossover']['on']} "
          f"(the cost model: {report['crossover']['predicted']}); auto at {report['crossover']['auto']}")
    print(f"wrote {args.out}/serve.json, serve.csv, serve.png, crossover.png in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
