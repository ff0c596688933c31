"""Load benchmark of the serving engine (notebook 11): throughput and latency against concurrency,
with speculation off, on (fixed gamma) and adaptive, on the course's target and draft.

A bounded, seeded stream of requests (code and math prompts, greedy and sampled, a stop
string) is served with ``concurrency`` requests in flight: a closed loop by default (a new
request joins as soon as one finishes), or Poisson arrivals at ``--rate`` requests per
second, capped at ``concurrency`` in flight. Only the in-process engine is measured.

    python -m specdec.bench.serve                        # artifacts/serve/serve.{json,csv,png}
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
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.ledger import expected_tokens_per_round
from specdec.models import corpus, tokenizer
from specdec.models.model import Llama
from specdec.params import GREEDY, SamplingParams
from specdec.paths import DATA_DIR
from specdec.serving.adaptive import BatchCosts
from specdec.serving.engine import ServingEngine

MODES = {"off": 0, "on": 4, "auto": "auto"}  # gamma per request
SETTINGS = (GREEDY, GREEDY, SamplingParams(temperature=0.7, top_p=0.95), SamplingParams(temperature=1.0, top_k=20))


@dataclass(frozen=True)
class Job:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    seed: int


def request_stream(n: int, max_tokens: int, seed: int = 0) -> list[Job]:
    """n requests alternating code and math prompts, with mixed sampling settings, seeded."""
    rng = random.Random(seed)
    code, math = corpus.code_prompts(n), corpus.math_prompts(n)
    jobs = []
    for i in range(n):
        prompts = code if i % 2 == 0 else math
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
    proposed = sum(s.proposed for s in seqs)
    steps = engine.steps
    return {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
            "ttft_mean_s": statistics.fmean(ttft), "ttft_p90_s": _quantile(ttft, 0.9),
            "tpot_mean_s": statistics.fmean(tpot), "tpot_p90_s": _quantile(tpot, 0.9),
            "acceptance": sum(s.accepted for s in seqs) / proposed if proposed else None,
            "mean_gamma": sum(s.drafts for s in steps) / max(sum(s.decoding_rows for s in steps), 1),
            "speculating_steps": sum(s.speculating_rows > 0 for s in steps) / max(len(steps), 1),
            "preemptions": sum(s.preemptions for s in seqs), "requests": len(seqs)}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def sweep(target: Llama, draft: Llama, levels: list[int], requests_per_level: int, max_tokens: int,
          rate: float | None = None, seed: int = 0, progress=print) -> dict:
    """Every mode at every concurrency level; the measured step costs; the cost model's prediction."""
    probe = ServingEngine(target, draft)
    costs = probe.measure_costs()
    rows = []
    for level in levels:
        jobs = request_stream(max(requests_per_level, 4 * level), max_tokens, seed)
        for mode, gamma in MODES.items():
            engine = ServingEngine(target, draft, num_blocks=4096, block_size=16, token_budget=1024, max_gamma=8,
                                   costs=costs)
            result = serve(engine, jobs, gamma, level, rate, seed)
            rows.append({"concurrency": level, "mode": mode, **result})
            progress(f"  concurrency {level:3d}  speculation {mode:4s}  {result['tokens_per_s']:7.0f} tokens/s  "
                     f"TTFT {result['ttft_mean_s'] * 1e3:6.0f} ms  TPOT {result['tpot_mean_s'] * 1e3:5.1f} ms"
                     + (f"  acceptance {result['acceptance']:.2f}" if result["acceptance"] is not None else ""))
    alpha = statistics.fmean(r["acceptance"] for r in rows if r["mode"] == "on")
    return {"rows": rows, "costs": {"target": costs[0].to_dict(), "draft": costs[1].to_dict()},
            "alpha_on": alpha, "prediction": predicted_speedups(alpha, costs, levels, gamma=MODES["on"]),
            "config": {"levels": levels, "requests_per_level": requests_per_level, "max_tokens": max_tokens,
                       "rate": rate, "seed": seed, "threads": torch.get_num_threads()}}


def predicted_speedups(alpha: float, costs: tuple[BatchCosts, BatchCosts], levels: list[int], gamma: int) -> list[dict]:
    """Notebook 01's batch model with the measured forward costs: speculation's throughput over plain
    decoding at each batch size, for a fixed gamma and for the best gamma (0 when nothing beats plain)."""
    step, draft = costs
    out = []
    for batch in levels:
        rate = lambda g: batch * expected_tokens_per_round(alpha, g) / (g * draft(batch, 1) + step(batch, g + 1))  # noqa: E731
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


def plot(report: dict, path: Path | None = None):
    import matplotlib.pyplot as plt

    rows, colors = report["rows"], {"off": "tab:gray", "on": "tab:blue", "auto": "tab:green"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for mode, color in colors.items():
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["concurrency"])
        x = [r["concurrency"] for r in mine]
        axes[0].plot(x, [r["tokens_per_s"] for r in mine], "o-", color=color, label=f"speculation {mode}")
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


def main(argv: list[str] | None = None) -> int:
    from specdec.models.checkpoints import load_pair

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DATA_DIR / "models")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--requests", type=int, default=16, help="requests per level (at least 4x the concurrency)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second (default: closed loop)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier timings)")
    parser.add_argument("--out", type=Path, default=Path("artifacts") / "serve")
    parser.add_argument("--notebook-reference", type=Path, metavar="JSON", help="write the report here instead (for notebook 11)")
    args = parser.parse_args(argv)
    for name in ("requests", "max_tokens", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if min(args.concurrency) < 1 or (args.rate is not None and args.rate <= 0):
        parser.error("concurrency levels and --rate must be positive")
    torch.set_num_threads(args.threads)
    try:
        target, draft = load_pair(args.models)
    except (FileNotFoundError, ValueError) as error:
        print(f"bench_serve: {error}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    print(f"serving load sweep: concurrency {args.concurrency}, speculation off / on (gamma {MODES['on']}) / auto")
    report = sweep(target, draft, sorted(args.concurrency), args.requests, args.max_tokens, args.rate, args.seed)
    report["measured_on"] = f"{time.strftime('%Y-%m-%d')}, {args.threads} CPU thread(s)"
    report["seconds"] = round(time.perf_counter() - start)
    report["crossover"] = {"on": crossover(report["rows"], "on"), "auto": crossover(report["rows"], "auto")}
    if args.notebook_reference:
        args.notebook_reference.parent.mkdir(parents=True, exist_ok=True)
        args.notebook_reference.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.notebook_reference} in {report['seconds']} s")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve.json").write_text(json.dumps(report, indent=1) + "\n")
    with open(args.out / "serve.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(report["rows"][0]))
        writer.writeheader()
        writer.writerows(report["rows"])
    plot(report, args.out / "serve.png")
    print(f"crossover (speculation no longer faster): gamma {MODES['on']} at {report['crossover']['on']}, "
          f"auto at {report['crossover']['auto']} concurrent requests")
    print(f"wrote {args.out}/serve.json, serve.csv, serve.png in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
