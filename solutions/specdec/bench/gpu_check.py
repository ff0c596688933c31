"""``make gpu-check``: everything in the course that needs a GPU, as one prepared run into one JSON report.

Stages, each recorded as passed, failed (with its error) or skipped (with why), and its seconds:

1. ``compile``: every reference kernel through the whole compiler for sm_80 and sm_90 (runs anywhere).
2. ``kernels``: the compiled kernels against their PyTorch references at the compile report's shapes.
3. ``bandwidth``: ``make bench-kernels``: the fused verifier's achieved bandwidth as a fraction of the device's peak.
4. ``engine``: speculative decoding (notebook 05) on the GPU: greedy output equal to target-only decoding.
5. ``serving``: the serving engine (notebook 11) on the GPU, every request equal to target-only decoding.

Without a CUDA GPU, stage 1 runs and the others say that they need one. Expected time on one H100 or
H200: well under the 5 minutes allowed (most of it the timing loops of ``bandwidth``).

    python -m specdec.bench.gpu_check [--out artifacts/gpu-check.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from specdec.paths import REPO_ROOT

STAGES = ("compile", "kernels", "bandwidth", "engine", "serving")
#: The shapes stage 2 runs at: the compile report's on a GPU, a few small ones when the stages are tried on a CPU.
GPU_SHAPES = {"B": 64, "V": 128256, "GAMMA": 4, "H": 32, "N": 12, "L": 2048, "D": 128}
CPU_SHAPES = {"B": 5, "V": 300, "GAMMA": 3, "H": 2, "N": 12, "L": 9, "D": 16}


def compile_stage() -> dict:
    from specdec.bench import compiled

    rows, missing = compiled.report(compiled.reference_kernels())
    if missing:
        raise AssertionError(f"not compiled: {missing}")
    print(compiled.format_report(rows))
    return {"rows": [asdict(r) for r in rows]}


def kernels_stage(device: torch.device, shapes: dict[str, int]) -> dict:
    """Each kernel launched on ``device`` against its PyTorch reference on the same inputs."""
    from specdec import kernels as k
    from specdec.checks.kernels import verify_inputs
    from specdec.tree import DEFAULT_CHOICES, flatten_tree, tree_mask

    B, V, gamma = shapes["B"], shapes["V"], shapes["GAMMA"]
    g = torch.Generator().manual_seed(0)
    w, x = torch.rand(B, V, generator=g), 30 * torch.randn(B, V, generator=g)
    e = k.exponential_noise(B, V, generator=g)
    results = {}
    picked = k.race(w.to(device), e.to(device)).cpu()
    results["race_kernel"] = _agree(torch.equal(picked, k.race_reference(w, e)), "the same token per row")
    lse = k.logsumexp(x.to(device)).cpu()
    results["logsumexp_kernel"] = _agree(torch.allclose(lse, torch.logsumexp(x, -1), rtol=1e-5, atol=1e-4),
                                         f"max |difference| {float((lse - torch.logsumexp(x, -1)).abs().max()):.2g}")
    args = verify_inputs(B, gamma, V, seed=0)
    fused = [t.cpu() for t in k.verify_chain_fused(*[t.to(device) for t in args])]
    results["verify_chain_kernel"] = _agree(all(map(torch.equal, fused, k.verify_chain_reference(*args))),
                                            "the same tokens and counts for sampling and greedy rows")
    tree = flatten_tree(DEFAULT_CHOICES)
    H, N, L, D = shapes["H"], len(tree.parents), shapes["L"], shapes["D"]
    q = torch.randn(H, N, D, generator=g)
    key, value = torch.randn(H, L + N, D, generator=g), torch.randn(H, L + N, D, generator=g)
    mask = tree_mask(tree.parents)
    out = k.tree_attention(q.to(device), key.to(device), value.to(device), mask.to(device)).cpu()
    expected = k.tree_attention_reference(q, key, value, mask)
    results["tree_attention_kernel"] = _agree(torch.allclose(out, expected, rtol=1e-4, atol=1e-4),
                                              f"max |difference| {float((out - expected).abs().max()):.2g}")
    failed = [name for name, r in results.items() if not r["equal"]]
    if failed:
        raise AssertionError(f"{', '.join(failed)} differ from their references: {results}")
    return {"shapes": {**shapes, "N": N}, "kernels": results}


def _agree(equal: bool, what: str) -> dict:
    return {"equal": bool(equal), "what": what}


def bandwidth_stage() -> dict:
    from specdec.bench.kernels import measure, peak_bandwidth

    peak = peak_bandwidth(torch.cuda.get_device_name())
    rows = measure(peak)
    best = max((r["fraction_of_peak"] or 0.0) for r in rows)
    print(f"fused verifier: best {100 * best:.0f}% of peak bandwidth" if peak else "peak bandwidth unknown")
    return {"peak_bandwidth": peak, "rows": rows}


@functools.cache
def _models(device: torch.device):
    """The shipped (target, draft) on ``device``, loaded once for the stages that need them."""
    from specdec.models.checkpoints import load_pair

    target, draft = load_pair()
    return target.to(device), draft.to(device)


def engine_stage(device: torch.device, n_tokens: int = 48) -> dict:
    """Greedy speculative decoding at gamma 1, 4 and 8 equals target-only decoding, on ``device``."""
    from specdec.engine import speculative_generate, target_only_generate

    target, draft = _models(device)
    prompt = list(range(1, 17))
    with torch.device(device):
        expected = target_only_generate(target, prompt, n_tokens)
        outputs = {gamma: speculative_generate(target, draft, prompt, n_tokens, gamma) for gamma in (1, 4, 8)}
    differ = [gamma for gamma, out in outputs.items() if out != expected]
    if differ:
        raise AssertionError(f"greedy speculative decoding at gamma {differ} differs from target-only decoding")
    return {"tokens": n_tokens, "gammas": sorted(outputs)}


def serving_stage(device: torch.device, n_requests: int = 6, max_tokens: int = 24,
                  gammas: tuple[int | str, ...] = (3, "auto")) -> dict:
    """The serving engine with prefix caching, requests taking ``gammas`` in turn ("auto" measures the step costs
    first): every request equals target-only decoding."""
    from specdec.engine import target_only_generate
    from specdec.serving.engine import ServingEngine

    target, draft = _models(device)
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(1, target.config.vocab_size, (12,), generator=g).tolist()
    prompts = [shared + torch.randint(1, target.config.vocab_size, (4 + i,), generator=g).tolist() for i in range(n_requests)]
    with torch.device(device):
        engine = ServingEngine(target, draft, num_blocks=64, block_size=8, prefix_caching=True)
        ids = [engine.add_request(p, max_tokens, gamma=gammas[i % len(gammas)]) for i, p in enumerate(prompts)]
        done = engine.run()
        expected = [target_only_generate(target, p, max_tokens) for p in prompts]
    differ = [i for i, seq_id in enumerate(ids) if done[seq_id].output != expected[i]]
    if differ:
        raise AssertionError(f"requests {differ} differ from target-only decoding")
    return {"requests": n_requests, "max_tokens": max_tokens, "gammas": list(gammas), "steps": len(engine.steps)}


def run_stage(name: str, work: Callable[[], dict]) -> dict:
    start = time.perf_counter()
    try:
        result = {"status": "passed", **work()}
    except Exception as err:  # a failed stage is reported and the next one still runs
        result = {"status": "failed", "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    result["seconds"] = round(time.perf_counter() - start, 2)
    print(f"[{name}] {result['status']} in {result['seconds']} s" + (f": {result['error']}" if "error" in result else ""))
    return result


def check(device: torch.device | None = None, shapes: dict[str, int] | None = None,
          stages: tuple[str, ...] = STAGES) -> dict:
    """Run the stages; on a CPU (or with no CUDA GPU) everything but ``compile`` is skipped unless ``device`` is given,
    which is how the tests try stages 2, 4 and 5 on a CPU at small shapes."""
    cuda = torch.cuda.is_available()
    device = device or (torch.device("cuda") if cuda else None)
    shapes = shapes or (GPU_SHAPES if cuda else CPU_SHAPES)
    work = {"compile": compile_stage, "kernels": lambda: kernels_stage(device, shapes), "bandwidth": bandwidth_stage,
            "engine": lambda: engine_stage(device), "serving": lambda: serving_stage(device)}
    report = {"device": torch.cuda.get_device_name() if cuda else f"no CUDA GPU ({platform.processor() or 'CPU'})",
              "torch": torch.__version__, "stages": {}}
    for name in stages:
        needs_gpu = name == "bandwidth" or (name != "compile" and device is None)
        if needs_gpu and not cuda:
            report["stages"][name] = {"status": "skipped", "why": "needs a CUDA GPU"}
            print(f"[{name}] skipped: needs a CUDA GPU")
            continue
        report["stages"][name] = run_stage(name, work[name])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "artifacts" / "gpu-check.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    report = check()
    report["seconds"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    statuses = [s["status"] for s in report["stages"].values()]
    print(f"{report['device']}: " + ", ".join(f"{n} {s['status']}" for n, s in report["stages"].items())
          + f" in {report['seconds']} s; report: {args.out}")
    if "skipped" in statuses:
        print("The stages that were skipped need a CUDA GPU: run `make gpu-check` there (about a minute).")
    return 1 if "failed" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
