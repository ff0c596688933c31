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

For each: acceptance rate, tokens committed per round, tokens/s, the wall-clock speedup
over the same implementation's target-only decoding, and the cost model's prediction
S = E(a, gamma) / (1 + gamma c) from the measured acceptance a and cost ratio c (plus a
prediction that uses the measured cost of verifying gamma + 1 positions, which on a CPU
is not the cost of one). Wall times are medians over --repeats runs of each prompt;
``speedup`` includes the prompt's prefill (the same in both), ``decode_speedup`` does not.
Writes bench.json, bench.csv and bench.png (to --out) and reports peak memory.

``python -m specdec.bench.speculative --target T --draft D --prompts code|math|FILE`` runs the loop on any
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

from specdec.drafts import expected_acceptance
from specdec.ledger import expected_tokens_per_round, speedup
from specdec.models import corpus, tokenizer
from specdec.models.checkpoints import load, load_pair
from specdec.models.model import KVCache, Llama
from specdec.params import SamplingParams, check_request
from specdec.paths import DATA_DIR
from specdec.recording import SpeculativeEngine
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
    """(result of the last run, median wall seconds) of ``run()`` called ``repeats`` times."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def _row(task, proposer, gamma, accepted, proposed, rounds, tokens, seconds, base_seconds, c, verify_ratio, identical,
         time_split=None, decode_speedup=None):
    a = accepted / proposed if proposed else None
    row = {
        "task": task, "proposer": proposer, "gamma": gamma,
        "acceptance": round(a, 4) if a is not None else None,
        "tokens_per_round": round(tokens / rounds, 3) if rounds else None,
        "tokens_per_s": round(tokens / seconds, 1), "target_only_tokens_per_s": round(tokens / base_seconds, 1),
        "speedup": round(base_seconds / seconds, 3),
        "decode_speedup": round(decode_speedup, 3) if decode_speedup else None,
        "c": round(c, 4) if c else None,
        "predicted": None, "predicted_measured_costs": None, "identical": identical,
    }
    if a is not None and c:
        row["predicted"] = round(speedup(min(a, 1.0), gamma, c), 3)
        row["predicted_measured_costs"] = round(expected_tokens_per_round(min(a, 1.0), gamma) / (gamma * c + verify_ratio), 3)
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
          bar: tqdm | None = None) -> tuple[list[dict], dict[str, list[list[int]]]]:
    """Greedy runs of this course's engine: per task (prompt token lists by task name), proposer and
    gamma, one row of measurements (see the module doc; ``rounds`` holds each round's statistics),
    and the target-only outputs by task. Wall times are medians over ``repeats``."""
    rows, base_tokens = [], {}
    tree = lambda ids, n, gamma: engine.generate_tree(ids, n)  # noqa: E731 (one fixed tree, depth 4)
    generators = {"draft": (engine.generate, costs["c"], gammas), "lookup": (engine.generate_lookup, 1e-9, gammas),
                  "tree": (tree, costs["c"], [max(flatten_tree(DEFAULT_CHOICES).depths)])}
    for task, encoded in prompts.items():
        base, base_s, base_prefill = [], 0.0, 0.0
        for ids in encoded:
            gen, s = _median_time(lambda: engine.generate_target_only(ids, n_tokens), repeats)
            base.append(gen.tokens)
            base_s += s
            base_prefill += gen.prefill_s
            if bar is not None:
                bar.update()
        base_tokens[task] = base
        for proposer in proposers:
            generate, c, proposer_gammas = generators[proposer]
            for gamma in proposer_gammas:
                seconds = prefill = 0.0
                rounds, identical = [], True
                split = {"draft_frac": 0.0, "target_frac": 0.0, "other_frac": 0.0}
                for ids, want in zip(encoded, base):
                    gen, s = _median_time(lambda: generate(ids, n_tokens, gamma), repeats)
                    identical &= gen.tokens == want
                    seconds += s
                    prefill += gen.prefill_s
                    rounds += gen.rounds
                    split["draft_frac"] += sum(r.draft_s for r in gen.rounds) / gen.wall_s / len(encoded)
                    split["target_frac"] += sum(r.target_s for r in gen.rounds) / gen.wall_s / len(encoded)
                    split["other_frac"] += (gen.other_s + gen.prefill_s) / gen.wall_s / len(encoded)
                    if bar is not None:
                        bar.update()
                row = _row(task, proposer, gamma, sum(r.accepted for r in rounds), sum(r.proposed for r in rounds),
                           len(rounds), n_tokens * len(encoded), seconds, base_s, c,
                           costs["verify_ratio"].get(gamma, 1.0), identical, split,
                           (base_s - base_prefill) / (seconds - prefill))
                row["rounds"] = [dataclasses.asdict(r) for r in rounds]
                rows.append(row)
    return rows, base_tokens


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
    config = {**WORKLOADS[workload], "workload": workload, "models": digest.hexdigest()[:16],
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
    runs = len(prompts) * config["prompts"] * (2 + 2 * len(config["gammas"]))
    with tqdm(total=runs, desc=f"measuring ({workload})", unit="run") as bar:
        rows, _ = sweep(engine, prompts, config["tokens"], config["gammas"], config["repeats"], costs, bar=bar)
    result = {"config": config, "costs": costs, "rows": rows}
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(result))
    return _int_gammas(json.loads(json.dumps(result)))


def _int_gammas(result: dict) -> dict:
    """JSON turns the gamma keys of verify_ratio into strings: turn them back."""
    result["costs"]["verify_ratio"] = {int(g): v for g, v in result["costs"]["verify_ratio"].items()}
    return result


def summary(result: dict) -> dict:
    """A notebook_sweep result without the per-round lists, with the per-position acceptance of each
    chain row instead (accepted over tested, where a round that proposed n drafts and accepted k tested
    min(k + 1, n); prompt lookup often proposes fewer than gamma): small enough to ship in data/."""
    rows = []
    for row in result["rows"]:
        row = dict(row)
        rounds = [r for r in row.pop("rounds") if r["proposed"] > 0]
        if row["proposer"] in ("draft", "draft_undistilled", "lookup") and rounds:
            tested = sum(min(r["accepted"] + 1, r["proposed"]) for r in rounds)
            row["per_position_acceptance"] = round(sum(r["accepted"] for r in rounds) / tested, 4)
        rows.append(row)
    return {"config": result["config"], "costs": result["costs"], "rows": rows}


def alignment(models: Path, n_prompts: int, n_tokens: int, repeats: int, costs: dict) -> dict:
    """The distilled draft against the undistilled control (same size, data and steps; learns the
    next byte alone), on the full workload's prompts:

    - ``expected``: per task, draft and temperature, the mean of sum_x min(p, q) (exact,
      :func:`specdec.drafts.expected_acceptance`) over the positions the target generates when it
      continues each prompt alone at that temperature (seeded);
    - ``sampled``: per task and temperature > 0, the distilled draft's per-position acceptance in
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
                                 "acceptance": round(float(scores.mean()), 4)})
        for temperature in TEMPERATURES[1:]:
            runs = [engine.generate(ids, n_tokens, 4, SamplingParams(temperature), generator) for ids in encoded]
            rounds = [r for g in runs for r in g.rounds]
            tested = sum(min(r.accepted + 1, r.proposed) for r in rounds)
            sampled.append({"task": task, "draft": "draft", "temperature": temperature, "gamma": 4,
                            "per_position_acceptance": round(sum(r.accepted for r in rounds) / tested, 4)})
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
    total = len(prompts) * n_prompts * (2 + 2 * len(gammas) + (1 + 2 * len(gammas) if with_hf else 0))
    bar = tqdm(total=total, desc="bench", unit="prompt")
    rows, base = sweep(engine, encoded, n_tokens, gammas, repeats, costs, bar=bar)
    for row in rows:
        row.pop("rounds")
        tqdm.write(json.dumps(row))
    if with_hf:
        rows += _run_hf(target, draft, encoded, base, n_tokens, gammas, repeats, bar)
    bar.close()
    return rows, costs


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
        rows.append(_row(task, "hf-target-only", 0, 0, 0, 0, n_tokens * len(prompts), hf_base_s, hf_base_s,
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
                rows.append(_row(task, proposer, gamma, 0, 0, 0, n_tokens * len(prompts), seconds, hf_base_s,
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="With --target and --draft (local folders or hub names): the same loop on "
                                            "a Hugging Face pair; see python -m specdec.bench.speculative "
                                            "--target x --draft y -h.")
    parser.add_argument("--models", type=Path, default=DATA_DIR / "models", help="folder with target/draft.safetensors")
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 3, 4, 5, 6])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per task")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="runs per prompt; the median time counts")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (default: all cores)")
    parser.add_argument("--hf", action="store_true", help="also run transformers' assisted generation and prompt lookup")
    parser.add_argument("--out", type=Path, default=Path("artifacts") / "bench", help="folder for json, csv and png")
    parser.add_argument("--notebook-reference", type=Path, metavar="JSON",
                        help="instead: run notebook 09's full sweep and write its summary here "
                             "(the course ships data/bench/nb09_full.json)")
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
    for name in ("prompts", "tokens", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    torch.set_num_threads(args.threads)
    try:
        rows, costs = run(args.models, args.gammas, args.prompts, args.tokens, args.repeats, args.hf)
    except (FileNotFoundError, ValueError) as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = {"rows": rows, "costs": costs, "peak_rss_mib": round(peak_mib, 1), "threads": args.threads,
              "prompts_per_task": args.prompts, "tokens": args.tokens, "repeats": args.repeats}
    (args.out / "bench.json").write_text(json.dumps(report, indent=1))
    with open(args.out / "bench.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.out / "bench.png")
    print(f"peak memory (max RSS) {peak_mib:.0f} MiB; wrote {args.out}/bench.json, bench.csv, bench.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
