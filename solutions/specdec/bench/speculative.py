"""Benchmark speculative decoding on the shipped checkpoints (not a test).

``python -m specdec.bench.speculative`` (``make bench``) measures, per task (code, math), per draft
length gamma and per proposer, batch 1:

- ``draft``: this course's engine with the shipped draft model, ``lookup``: the same
  engine with prompt-lookup (n-gram) proposals, and ``tree``: a 12-node tree of the
  draft's top candidates (depth 4) verified in one masked forward; greedy outputs are
  checked equal to target-only decoding;
- ``hf-assisted`` and ``hf-prompt-lookup`` (with ``--hf``): Hugging Face transformers'
  assisted generation and prompt lookup on the same weights, next to transformers'
  own target-only decoding, outputs checked against ours.

For each: acceptance in its three forms (``alpha`` per position, ``draft_acceptance_rate`` =
accepted / proposed, ``tokens_per_round`` = tau; :mod:`specdec.metrics`), tokens/s (median, min and
max over repeats), the wall-clock speedup over the same implementation's target-only decoding, and
the cost model's predictions: S = E(alpha, gamma) / (1 + gamma c) from the micro-benchmark c
(``predicted``), with the measured verify cost (``predicted_measured_costs``), with the run's own
forward costs (``model_measured_costs``) and with a fitted per-round fixed cost c0 (``fitted``).
Every method runs once per repeat, interleaved with the others, so the speedups are ratios from one
run; a busy machine or a spread over 10% prints a warning and records it (``machine``).
``speedup`` includes the prompt's prefill (the same in both), ``decode_speedup`` does not.
Writes bench.json, bench.csv and bench.png (to --out) and reports peak memory.

``python -m specdec.bench --target T --draft D --prompts code|math|FILE`` runs the loop on any
Hugging Face pair instead (:mod:`specdec.bench.pretrained`).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdec.analysis import fit_round_costs, measured_costs
from specdec.bench.timing import LoadWatch, interleaved, spread
from specdec.drafts import expected_acceptance
from specdec.ledger import expected_tokens_per_round, speedup
from specdec.metrics import acceptance_metrics
from specdec.models import corpus, tokenizer
from specdec.models.checkpoints import load, load_pair
from specdec.models.model import KVCache, Llama
from specdec.models.threads import all_cores
from specdec.params import SamplingParams, check_request
from specdec.paths import DATA_DIR
from specdec.recording import RoundStats, SpeculativeEngine
from specdec.tree import DEFAULT_CHOICES, flatten_tree


def step_time(model: Llama, context: int = 64, tokens: int = 1, repeats: int = 30) -> float:
    """Median seconds of one cached forward over ``tokens`` positions after ``context`` cached ones."""
    cache = KVCache(model.config)
    with torch.no_grad():
        model(torch.zeros(1, context, dtype=torch.long), cache)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(torch.zeros(1, tokens, dtype=torch.long), cache)
            times.append(time.perf_counter() - start)
            cache.crop(context)
    return statistics.median(times)


def _median_time(run, repeats: int):
    """(result of the last run, median wall seconds) of ``run()`` called ``repeats`` times (transformers' rows)."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def _row(task, proposer, gamma, rounds, tokens, seconds, base_seconds, c, verify_ratio, identical,
         time_split=None, decode_speedup=None):
    """One measured configuration. Acceptance in its three forms (specdec.metrics): ``alpha`` (per position,
    what E takes), ``draft_acceptance_rate`` (accepted / proposed) and ``tokens_per_round`` (tau, the
    correction or bonus token included). ``predicted``: notebook 01's E(alpha, gamma) / (1 + gamma c) with the
    micro-benchmark c; ``predicted_measured_costs``: the same with the measured cost of verifying gamma + 1
    positions."""
    chain = [(r.accepted, r.proposed) for r in rounds if r.proposed > 0]
    m = acceptance_metrics(*zip(*chain)) if chain else None
    alpha = m["alpha"] if m else None
    row = {
        "task": task, "proposer": proposer, "gamma": gamma,
        "alpha": round(alpha, 4) if m else None,
        "draft_acceptance_rate": round(m["draft_acceptance_rate"], 4) if m else None,
        "tokens_per_round": round(sum(r.committed for r in rounds) / len(rounds), 3) if rounds else None,
        "tokens_per_s": round(tokens / seconds["median"], 1),
        "tokens_per_s_min": round(tokens / seconds["max"], 1), "tokens_per_s_max": round(tokens / seconds["min"], 1),
        "spread": round(seconds["spread"], 4),
        "target_only_tokens_per_s": round(tokens / base_seconds, 1),
        "speedup": round(base_seconds / seconds["median"], 3),
        "decode_speedup": round(decode_speedup, 3) if decode_speedup else None,
        "c": round(c, 4) if c else None,
        "predicted": None, "predicted_measured_costs": None, "identical": identical,
    }
    if alpha is not None and c:
        row["predicted"] = round(speedup(alpha, gamma, c), 3)
        row["predicted_measured_costs"] = round(expected_tokens_per_round(alpha, gamma) / (gamma * c + verify_ratio), 3)
    if time_split:
        row.update({k: round(v, 3) for k, v in time_split.items()})
    return row


def measure_costs(target: Llama, draft: Llama, gammas: Sequence[int]) -> dict:
    """One-token step times of both models, c, and the cost of verifying gamma + 1 positions."""
    t1, d1 = step_time(target), step_time(draft)
    return {"target_step_ms": t1 * 1e3, "draft_step_ms": d1 * 1e3, "c": d1 / t1,
            "verify_ratio": {g: step_time(target, tokens=g + 1) / t1 for g in gammas}}


def sweep(engine: SpeculativeEngine, prompts: dict[str, list[list[int]]], n_tokens: int, gammas: Sequence[int],
          repeats: int, costs: dict, proposers: Sequence[str] = ("draft", "lookup", "tree"),
          bar: tqdm | None = None, watch: LoadWatch | None = None) -> tuple[list[dict], dict[str, list[list[int]]]]:
    """Greedy runs of this course's engine: per task (prompt token lists by task name), proposer and gamma, one
    row of measurements (see the module doc; ``rounds`` holds each round's statistics), and the target-only
    outputs by task. Every method (target-only included) runs once per repeat on each prompt, interleaved
    (:func:`specdec.bench.timing.interleaved`); a method's time is the median over repeats of its total over
    the prompts, with the min and max beside it."""
    rows, base_tokens = [], {}
    tree_depth = max(flatten_tree(DEFAULT_CHOICES).depths)
    runners = {"target-only": lambda ids, gamma: engine.generate_target_only(ids, n_tokens),
               "draft": lambda ids, gamma: engine.generate(ids, n_tokens, gamma),
               "lookup": lambda ids, gamma: engine.generate_lookup(ids, n_tokens, gamma),
               "tree": lambda ids, gamma: engine.generate_tree(ids, n_tokens)}  # one fixed tree
    methods = [("target-only", 0)] + [(p, g) for p in proposers for g in ([tree_depth] if p == "tree" else gammas)]
    for task, encoded in prompts.items():
        totals = {m: [0.0] * repeats for m in methods}  # per repeat, seconds summed over the prompts
        runs = {m: [] for m in methods}  # per prompt, the last repeat's Generation
        for ids in encoded:
            for repeat, method in interleaved(methods, repeats):
                start = time.perf_counter()
                gen = runners[method[0]](ids, method[1])
                totals[method][repeat] += time.perf_counter() - start
                if repeat == repeats - 1:
                    runs[method].append(gen)
                if bar is not None:
                    bar.update()
            if watch is not None:
                watch.sample()
        base = runs[methods[0]]
        base_tokens[task] = [g.tokens for g in base]
        base_s = statistics.median(totals[methods[0]])
        base_decode_s = base_s - sum(g.prefill_s for g in base)
        for method in methods[1:]:
            proposer, gamma = method
            gens, times = runs[method], spread(totals[method])
            rounds = [r for g in gens for r in g.rounds]
            split = {name: sum(part(g) / g.wall_s for g in gens) / len(gens) for name, part in (
                ("draft_frac", lambda g: sum(r.draft_s for r in g.rounds)),
                ("target_frac", lambda g: sum(r.target_s for r in g.rounds)),
                ("other_frac", lambda g: g.other_s + g.prefill_s))}
            prefill_s = sum(g.prefill_s for g in gens)
            decode_s = times["median"] - prefill_s
            row = _row(task, proposer, gamma, rounds, n_tokens * len(encoded), times, base_s,
                       1e-9 if proposer == "lookup" else costs["c"], costs["verify_ratio"].get(gamma, 1.0),
                       all(g.tokens == b.tokens for g, b in zip(gens, base)), split, base_decode_s / decode_s)
            row["decode_s_per_round"] = decode_s / len(rounds)
            row["prefill_s"] = prefill_s
            row["target_only_prefill_s"] = base_s - base_decode_s
            row["target_only_decode_s_per_token"] = base_decode_s / (n_tokens * len(encoded))
            row["new_tokens"] = n_tokens * len(encoded)
            row["target_only_forward_s"] = sum(g.forward_s for g in base)  # every target forward, prefill included
            row["rounds"] = [dataclasses.asdict(r) for r in rounds]
            rows.append(row)
    add_cost_fits(rows, costs["target_step_ms"] / 1e3)
    return rows, base_tokens


def add_cost_fits(rows: list[dict], target_step_s: float) -> None:
    """For each task's draft-model rows: ``model_measured_costs``, the cost model with the run's own forward costs
    and nothing else (the target-only run's forwards, prefill included, against the speculative run's prefill and
    N / E(alpha, gamma) rounds of its measured draft and verify forwards); and ``fitted``,
    the whole run predicted from a per-round fixed cost c0 fitted beside gamma * c
    (:func:`specdec.analysis.fit_round_costs`), the measured verify forwards, E(alpha, gamma) tokens per round
    and the run's own prefill and target-only time per token. c0 and the fitted c are in target steps."""
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task and r["proposer"] == "draft" and r.get("rounds")]
        if len(mine) < 2:
            continue
        verify_s = [statistics.fmean(x["target_s"] for x in r["rounds"]) for r in mine]
        c0_s, per_draft_s = fit_round_costs([r["gamma"] for r in mine], [r["decode_s_per_round"] for r in mine], verify_s)
        for r, v_s in zip(mine, verify_s):
            stats = [RoundStats(**x) for x in r["rounds"]]
            c_run, v_run = measured_costs(stats, target_step_s)
            e = expected_tokens_per_round(r["alpha"], r["gamma"])
            forwards_per_round = (sum(x.draft_s for x in stats) + sum(x.target_s for x in stats)) / len(stats)
            r["model_measured_costs"] = round(r["target_only_forward_s"] / (
                r["prefill_s"] + r["new_tokens"] / e * forwards_per_round), 3)
            base_s = r["target_only_prefill_s"] + r["new_tokens"] * r["target_only_decode_s_per_token"]
            spec_s = r["prefill_s"] + r["new_tokens"] / e * (c0_s + r["gamma"] * per_draft_s + v_s)
            r["fitted"] = round(base_s / spec_s, 3)  # predicts "speedup", prefill included
            r["fit"] = {"c0": round(c0_s / target_step_s, 3), "c": round(per_draft_s / target_step_s, 3),
                        "c_run": round(c_run, 3), "verify_ratio_run": round(v_run, 3)}


#: The notebook's workloads: a small default that runs in well under a minute, and the full sweep.
WORKLOADS = {"small": {"prompts": 2, "tokens": 48, "gammas": [1, 2, 4, 6], "repeats": 3},
             "full": {"prompts": 8, "tokens": 128, "gammas": [1, 2, 3, 4, 5, 6, 8, 10, 12, 16], "repeats": 3}}

#: Draft alignment (notebook 09, section 8): temperatures at which acceptance is measured, and the
#: draft lengths at which the undistilled control draft is run through the engine.
TEMPERATURES = (0.0, 0.5, 1.0, 1.5)
CONTROL_GAMMAS = (2, 4, 8)



def notebook_sweep(workload: str = "small", models: Path = DATA_DIR / "models", cache: Path | None = None) -> dict:
    """Notebook 09's measurements: {"config", "costs", "rows"} for a workload of WORKLOADS, read from
    ``cache`` (a JSON file) when it holds the same configuration (workload, models, threads), else
    measured with a progress bar and written there."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {sorted(WORKLOADS)}, got {workload!r}")
    digest = hashlib.sha256()
    for name in ("target.safetensors", "draft.safetensors"):
        digest.update((Path(models) / name).read_bytes())
    config = {**WORKLOADS[workload], "workload": workload, "format": 2, "models": digest.hexdigest()[:16],
              "threads": torch.get_num_threads(), "python": sys.version.split()[0]}
    if cache is not None and cache.exists():
        try:
            stored = json.loads(cache.read_text())
        except json.JSONDecodeError:
            stored = {}
        if stored.get("config") == config:
            return _int_gammas(stored)
    target, draft = load_pair(models)
    engine = SpeculativeEngine(target, draft)
    prompts = {"code": [tokenizer.encode(t) for t in corpus.code_prompts(config["prompts"])],
               "math": [tokenizer.encode(t) for t in corpus.math_prompts(config["prompts"])]}
    costs = measure_costs(target, draft, config["gammas"])
    runs = len(prompts) * config["prompts"] * (2 + 2 * len(config["gammas"])) * config["repeats"]
    watch = LoadWatch(torch.get_num_threads())
    with tqdm(total=runs, desc=f"measuring ({workload})", unit="run") as bar:
        rows, _ = sweep(engine, prompts, config["tokens"], config["gammas"], config["repeats"], costs, bar=bar,
                        watch=watch)
    machine = watch.report({f"{r['task']} {r['proposer']} gamma {r['gamma']}": r["spread"] for r in rows})
    result = {"config": config, "costs": costs, "rows": rows, "machine": machine}
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(result))
    return _int_gammas(json.loads(json.dumps(result)))


def _int_gammas(result: dict) -> dict:
    """JSON turns the gamma keys of verify_ratio into strings: turn them back."""
    result["costs"]["verify_ratio"] = {int(g): v for g, v in result["costs"]["verify_ratio"].items()}
    return result


def summary(result: dict) -> dict:
    """A notebook_sweep result without the per-round lists and per-round times (small enough to ship in data/)."""
    rows = []
    for row in result["rows"]:
        rows.append({k: v for k, v in row.items() if k != "rounds"})
    return {k: v for k, v in result.items() if k != "rows"} | {"rows": rows}


def alignment(models: Path, n_prompts: int, n_tokens: int, repeats: int, costs: dict) -> dict:
    """The distilled draft against the undistilled control (same size, data and steps; learns the
    next byte alone), on the full workload's prompts:

    - ``expected``: per task, draft and temperature, the mean of sum_x min(p, q) (exact,
      :func:`specdec.drafts.expected_acceptance`) over the positions the target generates when it
      continues each prompt alone at that temperature (seeded);
    - ``sampled``: per task and temperature > 0, the distilled draft's per-position acceptance alpha in
      real sampled runs of the engine (gamma 4, top-k off), the check on the exact figure;
    - ``rows``: greedy engine runs of the control at CONTROL_GAMMAS (rows as in :func:`sweep`,
      proposer ``draft_undistilled``).
    """
    target, draft = load_pair(models)
    control = load(Path(models) / "draft_undistilled.safetensors")
    prompts = {"code": [tokenizer.encode(t) for t in corpus.code_prompts(n_prompts)],
               "math": [tokenizer.encode(t) for t in corpus.math_prompts(n_prompts)]}
    engine = SpeculativeEngine(target, draft)
    expected, sampled = [], []
    generator = torch.Generator().manual_seed(0)
    for task, encoded in prompts.items():
        for temperature in TEMPERATURES:
            params = SamplingParams(temperature)
            texts = [ids + engine.generate_target_only(ids, n_tokens, params, generator).tokens for ids in encoded]
            for name, model in (("draft", draft), ("draft_undistilled", control)):
                # position i of the scores predicts token i + 1: keep the generated tokens' positions
                scores = torch.cat([expected_acceptance(target, model, text, params)[len(ids) - 1:]
                                    for ids, text in zip(encoded, texts)])
                expected.append({"task": task, "draft": name, "temperature": temperature,
                                 "alpha": round(float(scores.mean()), 4)})
        for temperature in TEMPERATURES[1:]:
            runs = [engine.generate(ids, n_tokens, 4, SamplingParams(temperature), generator) for ids in encoded]
            rounds = [r for g in runs for r in g.rounds]
            tested = sum(min(r.accepted + 1, r.proposed) for r in rounds)
            sampled.append({"task": task, "draft": "draft", "temperature": temperature, "gamma": 4,
                            "alpha": round(sum(r.accepted for r in rounds) / tested, 4)})
    rows, _ = sweep(SpeculativeEngine(target, control), prompts, n_tokens, CONTROL_GAMMAS, repeats, costs,
                    proposers=("draft",))
    for row in rows:
        row["proposer"] = "draft_undistilled"
    return {"expected": expected, "sampled": sampled, "rows": rows}


def run(models: Path, gammas: list[int], n_prompts: int, n_tokens: int, repeats: int, with_hf: bool) -> tuple[list[dict], dict]:
    target, draft = load_pair(models)
    engine = SpeculativeEngine(target, draft)
    prompts = {"code": corpus.code_prompts(n_prompts), "math": corpus.math_prompts(n_prompts)}
    for texts in prompts.values():  # refuse a workload the models cannot serve before measuring anything
        for text in texts:
            check_request(target, draft, tokenizer.encode(text), n_tokens, max(gammas))
    costs = measure_costs(target, draft, gammas)
    print(f"target step {costs['target_step_ms']:.2f} ms, draft step {costs['draft_step_ms']:.2f} ms, "
          f"c = {costs['c']:.3f}; verifying gamma + 1 positions costs "
          + ", ".join(f"{v:.2f}x (gamma {g})" for g, v in costs["verify_ratio"].items()))
    encoded = {task: [tokenizer.encode(t) for t in texts] for task, texts in prompts.items()}
    total = len(prompts) * n_prompts * repeats * (2 + 2 * len(gammas)) + (
        len(prompts) * n_prompts * (1 + 2 * len(gammas)) if with_hf else 0)
    bar = tqdm(total=total, desc="bench", unit="run")
    watch = LoadWatch(torch.get_num_threads())
    rows, base = sweep(engine, encoded, n_tokens, gammas, repeats, costs, bar=bar, watch=watch)
    for row in rows:
        row.pop("rounds")
        tqdm.write(json.dumps({k: v for k, v in row.items() if k != "fit"}))
    if with_hf:
        rows += _run_hf(target, draft, encoded, base, n_tokens, gammas, repeats, bar)
    bar.close()
    machine = watch.report({f"{r['task']} {r['proposer']} gamma {r['gamma']}": r["spread"] for r in rows})
    return rows, costs, machine


def _run_hf(target: Llama, draft: Llama, encoded: dict[str, list[list[int]]], base: dict[str, list[list[int]]],
            n_tokens: int, gammas: list[int], repeats: int, bar: tqdm) -> list[dict]:
    """transformers' target-only decoding, assisted generation and prompt lookup on the same weights."""
    from transformers.utils import logging as hf_logging

    from specdec.models.hf import hf_generate, to_transformers

    hf_logging.set_verbosity_error()
    hf = to_transformers(target), to_transformers(draft)
    hf[1].generation_config.num_assistant_tokens_schedule = "constant"
    hf[1].generation_config.assistant_confidence_threshold = 0.0
    rows = []
    for task, prompts in encoded.items():
        hf_base_s = 0.0
        for ids, want in zip(prompts, base[task]):
            out, s = _median_time(lambda: hf_generate(hf[0], ids, n_tokens), repeats)
            hf_base_s += s
            if out != want:
                tqdm.write(f"note: transformers' greedy output differs from ours on a {task} prompt")
            bar.update()
        rows.append(_row(task, "hf-target-only", 0, [], n_tokens * len(prompts), spread([hf_base_s]), hf_base_s,
                         None, None, True))
        for gamma in gammas:
            for proposer, kwargs in (("hf-assisted", {"assistant_model": hf[1]}),
                                     ("hf-prompt-lookup", {"prompt_lookup_num_tokens": gamma})):
                hf[1].generation_config.num_assistant_tokens = gamma
                seconds, identical = 0.0, True
                for ids, want in zip(prompts, base[task]):
                    out, s = _median_time(lambda: hf_generate(hf[0], ids, n_tokens, **kwargs), repeats)
                    identical &= out == want
                    seconds += s
                    bar.update()
                rows.append(_row(task, proposer, gamma, [], n_tokens * len(prompts), spread([seconds]), hf_base_s,
                                 None, None, identical))
                tqdm.write(json.dumps(rows[-1]))
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, task in zip(axes, ("code", "math")):
        for proposer, style in (("draft", "o-"), ("lookup", "^-"), ("tree", "*"), ("hf-assisted", "s:"),
                                ("hf-prompt-lookup", "^:")):
            mine = [r for r in rows if r["task"] == task and r["proposer"] == proposer]
            if mine:
                ax.plot([r["gamma"] for r in mine], [r["speedup"] for r in mine], style, label=f"{proposer} (measured)")
        mine = [r for r in rows if r["task"] == task and r["proposer"] == "draft"]
        if mine:
            ax.plot([r["gamma"] for r in mine], [r["predicted"] for r in mine], "--", color="gray",
                    label="cost model E/(1 + gamma c)")
            ax.plot([r["gamma"] for r in mine], [r["predicted_measured_costs"] for r in mine], "-.", color="black",
                    label="cost model, measured verify cost")
        ax.axhline(1.0, color="lightgray", lw=1)
        ax.set_title(f"{task} prompts (greedy, batch 1, CPU)")
        ax.set_xlabel("gamma")
    axes[0].set_ylabel("speedup over target-only")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(arg.split("=")[0] in ("--target", "--draft") for arg in argv):  # a Hugging Face pair instead
        from specdec.bench.pretrained import main as bench_pretrained

        return bench_pretrained(argv)
    from specdec.bench.pretrained import build_parser as hf_parser

    hf_options = hf_parser().format_help().split("show this help message and exit", 1)[1]
    parser = argparse.ArgumentParser(
        prog="python -m specdec.bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Benchmark speculative decoding (not a test), in one of two modes:\n"
                    "  1. the course's shipped checkpoints (data/models/), both tasks, every proposer, a sweep of gamma:\n"
                    "       python -m specdec.bench [--num-prompts N] [--gammas G ...] [--hf] ...  (options below)\n"
                    "  2. any Hugging Face pair, chosen by --target (and --draft):\n"
                    "       python -m specdec.bench --target T [--draft D] [--prompts code|math|FILE] [--num-prompts N]",
        epilog=f"options of mode 2 (with --target):{hf_options}")
    parser.add_argument("--models", type=Path, default=DATA_DIR / "models", help="folder with target/draft.safetensors")
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 3, 4, 5, 6], help="draft lengths to sweep")
    parser.add_argument("--num-prompts", type=int, default=8, help="prompts per task (code and math)")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per prompt and method, interleaved; the median counts, min and max are kept")
    parser.add_argument("--threads", type=int, default=all_cores(), help="torch threads (default: all cores)")
    parser.add_argument("--hf", action="store_true", help="also run transformers' assisted generation and prompt lookup")
    parser.add_argument("--out", type=Path, default=Path("artifacts") / "bench", help="folder for json, csv and png")
    parser.add_argument("--notebook-reference", type=Path, metavar="JSON",
                        help="instead: run notebook 09's full sweep and write its summary here "
                             "(the course ships data/bench/nb09_full.json)")
    if any(arg.split("=")[0] == "--prompts" for arg in argv):
        parser.error("--prompts (code, math or a FILE) chooses a Hugging Face pair's prompts and needs --target; "
                     "the shipped checkpoints always run both tasks: --num-prompts N sets how many per task")
    args = parser.parse_args(argv)
    if args.notebook_reference:
        torch.set_num_threads(args.threads)
        start = time.perf_counter()
        full = notebook_sweep("full", args.models)
        aligned = alignment(args.models, full["config"]["prompts"], full["config"]["tokens"],
                            full["config"]["repeats"], full["costs"])
        reference = summary({**full, "rows": full["rows"] + aligned.pop("rows")})
        reference["alignment"] = aligned
        reference["measured_on"] = f"{time.strftime('%Y-%m-%d')}, {torch.get_num_threads()} CPU threads"
        reference["seconds"] = round(time.perf_counter() - start)
        args.notebook_reference.parent.mkdir(parents=True, exist_ok=True)
        args.notebook_reference.write_text(json.dumps(reference, indent=1))
        print(f"wrote {args.notebook_reference} in {reference['seconds']} s")
        return 0
    if any(g < 1 for g in args.gammas):
        parser.error(f"every gamma must be >= 1, got {args.gammas}")
    for name in ("num_prompts", "tokens", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    torch.set_num_threads(args.threads)
    try:
        rows, costs, machine = run(args.models, args.gammas, args.num_prompts, args.tokens, args.repeats, args.hf)
    except (FileNotFoundError, ValueError) as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = {"rows": rows, "costs": costs, "machine": machine, "peak_rss_mib": round(peak_mib, 1),
              "threads": args.threads, "prompts_per_task": args.num_prompts, "tokens": args.tokens, "repeats": args.repeats}
    (args.out / "bench.json").write_text(json.dumps(report, indent=1))
    with open(args.out / "bench.csv", "w", newline="") as f:
        flat = [{k: v for k, v in r.items() if k != "fit"} | {f"fit_{k}": v for k, v in r.get("fit", {}).items()}
                for r in rows]
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in flat for k in r)))
        writer.writeheader()
        writer.writerows(flat)
    plot(rows, args.out / "bench.png")
    print(f"peak memory (max RSS) {peak_mib:.0f} MiB; wrote {args.out}/bench.json, bench.csv, bench.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
