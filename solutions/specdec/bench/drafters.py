"""Notebook 12's measurement: every proposer on the same target, code against math (not a test).

For each task and proposer, greedy, batch 1, on the shipped models: tau (tokens committed per target
forward, the mean acceptance length), the acceptance at each draft position (P(at least i drafts
accepted in a round): vLLM's per-position rates, not alpha), the drafter's cost per round relative to
the target's verify forward (c), and the wall-clock speedup over target-only decoding (median of
interleaved repeats, with min and max). Every row's output is checked equal to target-only greedy decoding.

    python -m specdec.bench.drafters                                   # artifacts/drafters/drafters.json
    python -m specdec.bench.drafters --notebook-reference data/bench/nb12_drafters.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specdec.bench.timing import LoadWatch, interleaved, spread
from specdec.drafters.eagle3 import load_feature_drafter, per_position_rates
from specdec.drafters.generate import (
    MEDUSA_CHOICES,
    DraftRun,
    eagle2_generate,
    eagle_generate,
    feature_drafter_generate,
    medusa_generate,
)
from specdec.drafters.train import load_eagle, load_medusa
from specdec.models import corpus, tokenizer
from specdec.models.checkpoints import load_pair
from specdec.paths import DATA_DIR
from specdec.recording import SpeculativeEngine
from specdec.tree import DEFAULT_CHOICES

PROPOSERS = ("draft chain", "draft tree", "prompt lookup", "Medusa", "EAGLE chain", "EAGLE-2 tree")
#: Notebook 13's feature drafters (``python -m specdec.bench.eagle3``): proposer -> the drafter it runs.
FEATURE_PROPOSERS = {"MTP-style chain": "mtp", "fused chain": "fused", "EAGLE-3 chain": "eagle3"}
GAMMA = 4


def _from_generation(gen) -> DraftRun:
    return DraftRun(gen.tokens, [r.committed for r in gen.rounds], sum(r.target_s for r in gen.rounds),
                    sum(r.draft_s for r in gen.rounds), gen.wall_s)


def run_one(name: str, models: dict, prompt: list[int], n_tokens: int) -> DraftRun:
    target, engine = models["target"], models["engine"]
    if name == "draft chain":
        return _from_generation(engine.generate(prompt, n_tokens, GAMMA))
    if name == "draft tree":
        return _from_generation(engine.generate_tree(prompt, n_tokens, DEFAULT_CHOICES))
    if name == "prompt lookup":
        return _from_generation(engine.generate_lookup(prompt, n_tokens, GAMMA))
    if name == "Medusa":
        return medusa_generate(target, models["medusa"], prompt, n_tokens, MEDUSA_CHOICES)
    if name == "EAGLE chain":
        return eagle_generate(target, models["eagle"], prompt, n_tokens, GAMMA)
    if name == "EAGLE-2 tree":
        return eagle2_generate(target, models["eagle"], prompt, n_tokens)
    if name in FEATURE_PROPOSERS:
        return feature_drafter_generate(target, models[FEATURE_PROPOSERS[name]], prompt, n_tokens, GAMMA)
    raise ValueError(f"unknown proposer {name!r}")


def load_models(proposers, models_dir: Path, artifacts: Path) -> dict:
    """The target, the draft engine and every self-drafter the proposers need."""
    target, draft = load_pair(models_dir)
    models = {"target": target, "engine": SpeculativeEngine(target, draft)}
    if "Medusa" in proposers:
        models["medusa"] = load_medusa(models_dir / "medusa.safetensors")
    if {"EAGLE chain", "EAGLE-2 tree"} & set(proposers):
        models["eagle"] = load_eagle(models_dir / "eagle.safetensors")
    for name in set(proposers) & set(FEATURE_PROPOSERS):
        key = FEATURE_PROPOSERS[name]
        models[key] = load_feature_drafter(models_dir / "eagle3.safetensors" if key == "eagle3"
                                           else artifacts / f"{key}.safetensors")
    return models


def measure(n_prompts: int = 4, n_tokens: int = 96, repeats: int = 3, models_dir: Path = DATA_DIR / "models",
            progress=print, proposers: tuple[str, ...] = PROPOSERS,
            artifacts: Path = Path("artifacts") / "drafters") -> dict:
    models = load_models(proposers, models_dir, artifacts)
    rows, watch = [], LoadWatch(torch.get_num_threads())
    methods = ("target only",) + tuple(proposers)
    for task, texts in (("code", corpus.code_prompts(n_prompts)), ("math", corpus.math_prompts(n_prompts))):
        prompts = [tokenizer.encode(t) for t in texts]
        walls = {m: [0.0] * repeats for m in methods}  # per repeat, summed over the prompts
        runs: dict[str, list[DraftRun]] = {m: [] for m in methods}  # per prompt, the last repeat's run
        for prompt in prompts:
            for repeat, name in interleaved(methods, repeats):
                run = (_from_generation(models["engine"].generate_target_only(prompt, n_tokens)) if name == "target only"
                       else run_one(name, models, prompt, n_tokens))
                walls[name][repeat] += run.wall_s
                if repeat == repeats - 1:
                    runs[name].append(run)
            watch.sample()
        base = spread(walls["target only"])["median"]
        for name in proposers:
            committed = [c for r in runs[name] for c in r.committed]
            target_s, draft_s = sum(r.target_s for r in runs[name]), sum(r.draft_s for r in runs[name])
            identical = all(r.tokens == b.tokens for r, b in zip(runs[name], runs["target only"]))
            depth = max(committed) - 1
            acceptance = [sum(c - 1 >= i for c in committed) / len(committed) for i in range(1, max(depth, 1) + 1)]
            times = spread(walls[name])
            row = {"task": task, "proposer": name, "tau": sum(committed) / len(committed), "rounds": len(committed),
                   "acceptance_by_position": [round(a, 3) for a in acceptance],
                   "conditional_by_position": [None if a is None else round(a, 3)
                                               for a in per_position_rates(committed, max(depth, 1))],
                   "c": draft_s / target_s if target_s else 0.0,
                   "speedup": base / times["median"], "speedup_min": base / times["max"],
                   "speedup_max": base / times["min"], "spread": times["spread"], "identical": identical}
            rows.append(row)
            progress(f"  {task:4s} {name:14s} tau {row['tau']:.2f}  c {row['c']:.3f}  speedup {row['speedup']:.2f}x "
                     f"({row['speedup_min']:.2f}-{row['speedup_max']:.2f})  identical {identical}")
    machine = watch.report({f"{r['task']} {r['proposer']}": r["spread"] for r in rows})
    return {"rows": rows, "machine": machine,
            "config": {"prompts": n_prompts, "tokens": n_tokens, "repeats": repeats, "gamma": GAMMA,
                       "threads": torch.get_num_threads()}}


def main(argv: list[str] | None = None, proposers: tuple[str, ...] = PROPOSERS, name: str = "drafters",
         notebook: str = "12", description: str | None = None, extra=None) -> int:
    """The command line of this benchmark and of :mod:`specdec.bench.eagle3` (the same run over other proposers;
    ``extra()`` returns fields added to the report)."""
    parser = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts per task (code, math)")
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("artifacts") / "drafters")
    parser.add_argument("--notebook-reference", type=Path, metavar="JSON",
                        help=f"write here instead (notebook {notebook}'s copy)")
    args = parser.parse_args(argv)
    if min(args.num_prompts, args.tokens, args.repeats, args.threads) < 1:
        parser.error("--num-prompts, --tokens, --repeats and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    try:
        report = measure(args.num_prompts, args.tokens, args.repeats, proposers=proposers, artifacts=args.out)
        report.update(extra() if extra else {})
    except FileNotFoundError as error:
        print(f"bench.{name}: {error}", file=sys.stderr)
        return 2
    report["measured_on"] = f"{time.strftime('%Y-%m-%d')}, {args.threads} CPU thread(s)"
    report["seconds"] = round(time.perf_counter() - start)
    path = args.notebook_reference or args.out / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path} in {report['seconds']} s")
    return 0 if all(r["identical"] for r in report["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
