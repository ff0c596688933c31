"""Speculative decoding on any Hugging Face pair: ``python -m specdec.bench --target T --draft D``.

T and D are local model folders or hub names (``make hf-models`` writes the course's own
checkpoints as folders). Per prompt, batch 1, greedy, each method generating the same number of
new tokens (end-of-text tokens do not stop anyone, so all are timed on equal work):

- ``target only``: the course's target-only loop (notebook 05) through :mod:`specdec.models.pretrained`;
- ``speculative``: the course's ``speculative_generate`` (the reference of notebook 05) on the pair;
- ``prompt lookup``: notebook 06's n-gram proposals, no draft model (the only method without --draft);
- ``hf greedy``, ``hf assisted`` and ``hf prompt lookup`` (unless ``--no-hf``): transformers' own
  ``generate``: plain, with ``assistant_model=draft`` (a constant gamma drafts per round), and with
  ``prompt_lookup_num_tokens=gamma``.

It prints one table: tokens/s, the speedup over the same implementation's target-only decoding,
acceptance and tokens per target forward, whether the output equals target-only greedy, and the
measured cost ratio c of a draft step to a target step. Times are wall clock after a warm-up run;
on a GPU every forward ends in a copy of its logits to the host (the adapter's) or a device
synchronisation (around ``generate``), so no time is lost to queued kernels.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch

from specdec.bench.timing import LoadWatch, interleaved, spread
from specdec.metrics import alpha_from_counts
from specdec.models import corpus
from specdec.models.hf import hf_generate
from specdec.models.pretrained import PretrainedLM, load_pretrained, share_vocabulary
from specdec.models.threads import all_cores
from specdec.params import check_request, check_vocabularies
from specdec.recording import Generation, SpeculativeEngine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def read_prompts(spec: str, n: int) -> list[str]:
    """``code`` or ``math`` (the course's held-out prompts), or a file: .jsonl (a "prompt" field or a string per
    line) or text (one prompt per non-empty line, ``\\n`` for a newline inside one). The first n."""
    if spec == "code":
        return corpus.code_prompts(n)
    if spec == "math":
        return corpus.math_prompts(n)
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"--prompts must be code, math or a file of prompts; {spec!r} is none of them")
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error})") from None
    if path.suffix != ".jsonl":
        prompts = [line.replace("\\n", "\n") for line in lines]
    else:
        prompts = []
        for number, line in enumerate(lines, start=1):
            try:
                item = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not JSON ({error})") from None
            prompts.append(item.get("prompt") if isinstance(item, dict) else item)
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError(f"{path}: expected non-empty prompts (text lines, or .jsonl lines that are strings or "
                         "objects with a \"prompt\" string)")
    return prompts[:n]


def _sync(model: PretrainedLM) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def _timed_hf(model: PretrainedLM, ids: list[int], n_tokens: int, **kwargs) -> tuple[list[int], float]:
    _sync(model)
    start = time.perf_counter()
    out = hf_generate(model.model, ids, n_tokens, **kwargs)
    _sync(model)
    return out, time.perf_counter() - start


def run(target: PretrainedLM, draft: PretrainedLM | None, prompts: list[list[int]], n_tokens: int, gamma: int,
        with_hf: bool, repeats: int = 3) -> dict:
    """Every method on every prompt, ``repeats`` times interleaved (after one warm-up pass); per method the median
    over repeats of its total time, with min and max. Without a draft: target-only and prompt lookup."""
    engine = SpeculativeEngine(target, draft)
    methods = {"target only": lambda ids: engine.generate_target_only(ids, n_tokens)}
    if draft is not None:
        methods[f"speculative (gamma {gamma})"] = lambda ids: engine.generate(ids, n_tokens, gamma)
    methods[f"prompt lookup (gamma {gamma})"] = lambda ids: engine.generate_lookup(ids, n_tokens, gamma)
    if with_hf:
        methods["hf greedy"] = lambda ids: _timed_hf(target, ids, n_tokens)
        if draft is not None:
            config = draft.model.generation_config  # the assistant: gamma drafts every round, none skipped
            config.num_assistant_tokens, config.num_assistant_tokens_schedule = gamma, "constant"
            config.assistant_confidence_threshold = 0.0
            methods[f"hf assisted (gamma {gamma})"] = lambda ids: _timed_hf(target, ids, n_tokens,
                                                                            assistant_model=draft.model)
        methods[f"hf prompt lookup (gamma {gamma})"] = lambda ids: _timed_hf(target, ids, n_tokens,
                                                                             prompt_lookup_num_tokens=gamma)
    seconds = {m: [0.0] * repeats for m in methods}  # per repeat, summed over the prompts
    totals = {m: {"tokens": 0, "identical": 0, "accepted": 0, "proposed": 0, "rejections": 0, "committed": 0,
                  "rounds": 0} for m in methods}
    target_s = draft_s = 0.0
    draft_forwards = 0
    watch = LoadWatch(torch.get_num_threads())
    for ids in prompts[:1]:  # a warm-up pass, not counted
        for measure in methods.values():
            measure(ids)
    for ids in prompts:
        results = {}
        for repeat, method in interleaved(list(methods), repeats):
            results[method] = methods[method](ids)
            seconds[method][repeat] += results[method].wall_s if isinstance(results[method], Generation) \
                else results[method][1]
        watch.sample()
        base = results["target only"]  # the last repeat's results count the tokens and rounds
        target_s += (base.wall_s - base.prefill_s) / n_tokens
        for method, result in results.items():
            t = totals[method]
            tokens = result.tokens if isinstance(result, Generation) else result[0]
            t["tokens"] += len(tokens)
            t["identical"] += tokens == base.tokens
            if isinstance(result, Generation) and result.rounds:
                t["accepted"] += sum(r.accepted for r in result.rounds)
                t["proposed"] += sum(r.proposed for r in result.rounds)
                t["rejections"] += sum(r.accepted < r.proposed for r in result.rounds)
                t["committed"] += sum(r.committed for r in result.rounds)
                t["rounds"] += len(result.rounds)
                if method.startswith("speculative"):
                    draft_s += sum(r.draft_s for r in result.rounds)
                    draft_forwards += gamma * len(result.rounds)
    rows = []
    for method, t in totals.items():
        own_base = spread(seconds["hf greedy" if method.startswith("hf") else "target only"])
        times = spread(seconds[method])
        rows.append({
            "method": method, "tokens_per_s": t["tokens"] / times["median"],
            "tokens_per_s_min": t["tokens"] / times["max"], "tokens_per_s_max": t["tokens"] / times["min"],
            "spread": times["spread"], "speedup": own_base["median"] / times["median"],
            # acceptance in its three forms (specdec.metrics)
            "alpha": alpha_from_counts(t["accepted"], t["rejections"]) if t["proposed"] else None,
            "draft_acceptance_rate": t["accepted"] / t["proposed"] if t["proposed"] else None,
            "tokens_per_round": t["committed"] / t["rounds"] if t["rounds"] else None,
            "identical": f"{t['identical']}/{len(prompts)}",
        })
    target_step = target_s / len(prompts)
    draft_step = draft_s / draft_forwards if draft_forwards else None
    machine = watch.report({r["method"]: r["spread"] for r in rows})
    return {"rows": rows, "target_step_ms": 1000 * target_step, "machine": machine, "repeats": repeats,
            "draft_step_ms": 1000 * draft_step if draft_step else None,
            "c": draft_step / target_step if draft_step else None}


def format_table(result: dict) -> str:
    lines = [f"{'method':<30} {'tokens/s (min-max)':>20} {'speedup':>8} {'alpha':>6} {'acc.rate':>8} {'tau':>5} "
             f"{'= target-only':>14}"]
    for r in result["rows"]:
        alpha, rate, tau = ((f"{r[k]:.2f}" if r[k] is not None else "-")
                            for k in ("alpha", "draft_acceptance_rate", "tokens_per_round"))
        measured = f"{r['tokens_per_s']:.1f} ({r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f})"
        lines.append(f"{r['method']:<30} {measured:>20} {r['speedup']:>7.2f}x {alpha:>6} {rate:>8} {tau:>5} "
                     f"{r['identical']:>14}")
    costs = f"target step {result['target_step_ms']:.2f} ms"
    if result["c"] is not None:
        costs += f", draft step {result['draft_step_ms']:.2f} ms: c = {result['c']:.2f}"
    lines.append(costs + f" (each speedup is over the same implementation's target-only decoding; medians of "
                         f"{result['repeats']} interleaved repeats; alpha per position, acc.rate = accepted / proposed, "
                         f"tau = tokens per target forward)")
    lines += [f"warning: {w}" for w in result["machine"]["warnings"]]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The options of the Hugging Face mode (``python -m specdec.bench --target T [--draft D]``)."""
    parser = argparse.ArgumentParser(prog="python -m specdec.bench --target T [--draft D]",
                                     description="Speculative decoding on a Hugging Face target/draft pair.")
    parser.add_argument("--target", required=True, help="local model folder or hub name (e.g. Qwen/Qwen2.5-1.5B)")
    parser.add_argument("--draft", help="local model folder or hub name sharing the target's tokenizer (without: "
                                        "target-only and prompt lookup only)")
    parser.add_argument("--prompts", default="code", help="code, math, or a file (.jsonl or one prompt per line)")
    parser.add_argument("--num-prompts", type=int, default=4, help="how many prompts (default 4)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every method per prompt, interleaved; the "
                                                               "median counts (default 3)")
    parser.add_argument("--gamma", type=int, default=4, help="drafts per round (default 4)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="default: bfloat16 on a GPU (float16 without bf16), float32 on a CPU")
    parser.add_argument("--threads", type=int, default=all_cores(), help="CPU threads for torch (default: all cores)")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' own generate")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("num_prompts", "tokens", "gamma", "threads", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.device is not None:
        try:
            kind = torch.device(args.device).type
        except RuntimeError:
            kind = None
        if kind not in ("cpu", "cuda"):
            parser.error(f"--device {args.device}: use cpu or cuda (cuda:N for one of several GPUs)")
        if kind == "cuda" and not torch.cuda.is_available():
            parser.error(f"--device {args.device}: no CUDA device here")
    torch.set_num_threads(args.threads)
    try:
        texts = read_prompts(args.prompts, args.num_prompts)
        dtype = DTYPES[args.dtype] if args.dtype else None
        started = time.perf_counter()
        target = load_pretrained(args.target, args.device, dtype)
        draft = load_pretrained(args.draft, target.device, target.dtype) if args.draft else None
        if draft is not None:
            width = share_vocabulary(target, draft)
            if width is not None:
                print(f"the two LM heads are padded differently; both are cut to the {width} ids that cover the shared "
                      f"tokenizer's {len(target.tokenizer)} tokens")
            check_vocabularies(target, draft)
        prompts = [target.encode(text) for text in texts]
        for ids in prompts:
            check_request(target, draft, ids, args.tokens, args.gamma)
    except (OSError, ValueError) as error:  # ModelNotFoundError is an OSError; transformers raises OSError too
        print(f"bench: {error}", file=sys.stderr)
        return 2
    drafting = f"draft {draft.name} ({draft.num_params() / 1e6:.1f}M)" if draft else "no draft"
    print(f"target {target.name} ({target.num_params() / 1e6:.1f}M parameters), {drafting}, "
          f"{target.device.type} {str(target.dtype).removeprefix('torch.')}, "
          f"loaded in {time.perf_counter() - started:.1f} s; {len(prompts)} {args.prompts} prompts x {args.tokens} "
          f"tokens, greedy, batch 1")
    result = run(target, draft, prompts, args.tokens, args.gamma, not args.no_hf, args.repeats)
    print(format_table(result))
    memory = f"peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB host"
    if target.device.type == "cuda":
        memory += f", {torch.cuda.max_memory_allocated(target.device) / 2**30:.2f} GiB GPU"
    print(memory)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**result, "target": target.name, "draft": draft.name if draft else None,
                                         "device": target.device.type, "prompts": args.prompts,
                                         "tokens": args.tokens, "gamma": args.gamma}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
