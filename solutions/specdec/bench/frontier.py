"""Notebook 14's measurements: real MoE routing against independent routing, a layer-skip draft's acceptance by
exit layer, and the forward costs of the course's target and draft across the contexts it takes.

``python -m specdec.bench.frontier`` (``make bench-frontier-notebook`` writes notebook 14's copy,
``data/bench/nb14_frontier.json``). Everything runs on one CPU thread; the costs are medians of interleaved
passes, ratios taken within a pass (the machine's speed drifts by 10-30% within seconds here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specdec.bench.timing import LoadWatch
from specdec.engine import target_only_generate
from specdec.frontier.layerskip import layer_skip_generate, positions_per_layer
from specdec.frontier.moe import expected_experts_touched, mean_union, routing_of
from specdec.models import corpus, tokenizer
from specdec.models.checkpoints import load, load_pair
from specdec.paths import DATA_DIR
from specdec.serving.adaptive import BatchCosts
from specdec.serving.engine import ServingEngine

WINDOWS = (1, 2, 3, 5, 9, 17, 33)  # tokens per verify step of one row: gamma + 1
TEXT_TOKENS = 2048


def _held_out(task: str) -> list[int]:
    text = corpus.code_text(4 * TEXT_TOKENS, held_out=True) if task == "code" else corpus.math_text(64, seed=999_983)
    return tokenizer.encode(text)[:TEXT_TOKENS]


def routing_report(moe: torch.nn.Module) -> dict:
    """For held-out code and math: the mean distinct experts per layer that n consecutive tokens of one sequence
    route to (a row's verify step of n = gamma + 1 tokens), n tokens from random places (n rows' decode step), and
    each expert's share of the routing, beside the independent-routing formula."""
    config = moe.config
    out = {"experts": config.n_experts, "top_k": config.top_k, "layers": config.n_layers,
           "independent": {n: expected_experts_touched(n, config.top_k, config.n_experts) for n in WINDOWS}}
    g = torch.Generator().manual_seed(0)
    for task in ("code", "math"):
        ids = _held_out(task)
        window = config.max_seq_len
        routing = torch.cat([routing_of(moe, ids[i:i + window]) for i in range(0, len(ids), window)], dim=1)
        layers, tokens, _ = routing.shape
        scattered = {}
        for n in WINDOWS:
            picks = [torch.randperm(tokens, generator=g)[:n] for _ in range(300)]
            scattered[n] = sum(len(torch.unique(routing[layer][pick])) for pick in picks for layer in range(layers)) / (
                300 * layers)
        share = torch.bincount(routing.flatten(), minlength=config.n_experts).double() / routing.numel()
        out[task] = {"tokens": tokens, "consecutive": {n: mean_union(routing, n) for n in WINDOWS},
                     "scattered": scattered, "expert_share": [round(x, 4) for x in share.tolist()]}
    return out


def layer_skip_report(target: torch.nn.Module, gamma: int = 4, new_tokens: int = 64, prompts_per_task: int = 6) -> dict:
    """Greedy layer-skip drafting with the target's first 1..n-1 layers on the course's code and math prompts:
    acceptance (accepted / proposed), tokens per round, the positions each layer processed, and that every output
    equals target-only greedy decoding."""
    rows = [json.loads(line) for task in ("code", "math")
            for line in (DATA_DIR / "prompts" / f"{task}.jsonl").read_text().splitlines()[:prompts_per_task]]
    out = {"gamma": gamma, "new_tokens": new_tokens, "prompts_per_task": prompts_per_task, "by_exit": {}}
    for exit_layer in range(1, target.config.n_layers):
        for task in ("code", "math"):
            accepted = proposed = rounds = 0
            identical = True
            for row in (r for r in rows if r["task"] == task):
                prompt = tokenizer.encode(row["prompt"])[-(target.config.max_seq_len - new_tokens - gamma - 2):]
                with positions_per_layer(target) as counts:
                    tokens, stats = layer_skip_generate(target, exit_layer, prompt, new_tokens, gamma)
                identical &= tokens == target_only_generate(target, prompt, new_tokens) and len(set(counts)) == 1
                accepted, proposed, rounds = (accepted + stats["accepted"], proposed + stats["proposed"],
                                              rounds + stats["rounds"])
            out["by_exit"][f"{exit_layer} {task}"] = {
                "exit_layer": exit_layer, "task": task, "acceptance": accepted / proposed,
                "tokens_per_round": (accepted + rounds) / rounds, "identical_to_target": identical}
    return out


def context_costs(target: torch.nn.Module, draft: torch.nn.Module, contexts: list[int], rows: list[int],
                  passes: int = 3) -> dict:
    """Target and draft forward costs of ``rows`` decoding rows with 1 and 5 tokens each over each context, the
    contexts interleaved within each of ``passes`` passes; per context the verify-to-plain ratio (5 tokens per row
    against 1) and the draft-to-target ratio, medians over the passes."""
    engine = ServingEngine(target, draft)
    per: dict[int, list[tuple[BatchCosts, BatchCosts]]] = {c: [] for c in contexts}
    for p in range(passes):
        for context in contexts[p % len(contexts):] + contexts[:p % len(contexts)]:
            per[context].append(engine.measure_costs(rows=rows, per_row=(1, 5), context=context))
    out = {}
    for context, runs in per.items():
        out[context] = {
            rows_: {"verify_over_plain": statistics.median(t(rows_, 5) / t(rows_, 1) for t, _ in runs),
                    "draft_over_target": statistics.median(d(rows_, 1) / t(rows_, 1) for t, d in runs),
                    "plain_ms": statistics.median(t(rows_, 1) for t, _ in runs) * 1e3}
            for rows_ in rows}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DATA_DIR / "models")
    parser.add_argument("--out", type=Path, default=Path("artifacts") / "frontier" / "frontier.json")
    parser.add_argument("--contexts", type=int, nargs="+", default=[16, 128, 256, 480])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        target, draft = load_pair(args.models)
        moe = load(args.models / "moe_target.safetensors")
    except (FileNotFoundError, ValueError) as error:
        print(f"bench_frontier: {error}", file=sys.stderr)
        return 2
    watch, start = LoadWatch(1), time.perf_counter()
    report = {"routing": routing_report(moe)}
    watch.sample()
    report["layer_skip"] = layer_skip_report(target)
    watch.sample()
    report["context_costs"] = context_costs(target, draft, args.contexts, args.rows, args.passes)
    watch.sample()
    report["machine"] = {"load_average": watch.samples, "warnings": watch.warnings({})}
    report["measured_on"] = f"{time.strftime('%Y-%m-%d')}, 1 CPU thread"
    report["seconds"] = round(time.perf_counter() - start)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    routing = report["routing"]
    print("distinct experts per layer (of", routing["experts"], "), independent / consecutive code / math / scattered code:")
    for n in WINDOWS:
        print(f"  {n:3d} tokens  {routing['independent'][n]:5.2f}  {routing['code']['consecutive'][n]:5.2f}  "
              f"{routing['math']['consecutive'][n]:5.2f}  {routing['code']['scattered'][n]:5.2f}")
    for key, r in report["layer_skip"]["by_exit"].items():
        print(f"  layer-skip exit {key}: acceptance {r['acceptance']:.3f}, tokens/round {r['tokens_per_round']:.2f}, "
              f"identical {r['identical_to_target']}")
    for context, by_rows in report["context_costs"].items():
        print(f"  context {context:4d}: " + ", ".join(
            f"{rows} rows verify/plain {v['verify_over_plain']:.2f} draft/target {v['draft_over_target']:.2f}"
            for rows, v in by_rows.items()))
    for warning in report["machine"]["warnings"]:
        print("warning:", warning)
    print(f"wrote {args.out} in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
