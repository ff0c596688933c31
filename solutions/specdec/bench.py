"""Benchmark the speculative engine on the shipped checkpoints (not a test).

``python -m specdec.bench --models data/models --gammas 2 4 6 --prompts 8 --tokens 64``
measures, per task (code, math) and gamma: acceptance rate, tokens committed per round,
tokens/s, the wall-clock speedup over target-only decoding (both through the same cache
code, greedy), and the cost model's prediction from the measured acceptance a and cost
ratio c. Medians over prompts; writes bench.json next to the models unless --out says.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec import corpus, tokenizer
from specdec.engine import SpeculativeEngine
from specdec.ledger import speedup
from specdec.model import KVCache
from specdec.paths import DATA_DIR
from specdec.train import load


def step_time(model, context: int = 64, tokens: int = 1, repeats: int = 20) -> float:
    """Median seconds of one cached forward over `tokens` positions after `context` cached ones."""
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


def run(models: Path, gammas: list[int], n_prompts: int, n_tokens: int) -> list[dict]:
    target, draft = load(models / "target.safetensors"), load(models / "draft.safetensors")
    engine = SpeculativeEngine(target, draft)
    c = step_time(draft) / step_time(target)
    prompts = {"code": corpus.code_prompts(n_prompts), "math": corpus.math_prompts(n_prompts)}
    rows = []
    for task, texts in prompts.items():
        encoded = [tokenizer.encode(t) for t in texts]
        base = [engine.generate_target_only(ids, n_tokens) for ids in encoded]
        base_tps = statistics.median(n_tokens / g.wall_s for g in base)
        for gamma in gammas:
            runs = [engine.generate(ids, n_tokens, gamma) for ids in encoded]
            assert all(r.tokens == b.tokens for r, b in zip(runs, base)), "greedy speculative output differs"
            a = statistics.median(r.acceptance_rate for r in runs)
            tps = statistics.median(n_tokens / r.wall_s for r in runs)
            rows.append({
                "task": task, "gamma": gamma, "acceptance": round(a, 4),
                "tokens_per_round": round(statistics.median(r.tokens_per_round for r in runs), 3),
                "tokens_per_s": round(tps, 1), "target_only_tokens_per_s": round(base_tps, 1),
                "speedup": round(tps / base_tps, 3), "c": round(c, 4), "predicted": round(speedup(min(a, 1.0), gamma, c), 3),
            })
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DATA_DIR / "models")
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = run(args.models, args.gammas, args.prompts, args.tokens)
    out = args.out or args.models / "bench.json"
    out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
