"""Benchmark: batched verification against a per-position Python loop of the same rule.

``python -m specdec.bench.verify [--B 64] [--gamma 4] [--V 32000] [--repeats 5]`` prints
median times and their ratio for greedy and for sampling verification. The loops are
what a first implementation looks like: one row, one position, one ``.item()`` at a time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from specdec.chain import verify_chain_batched
from specdec.greedy import greedy_verify_batched
from specdec.rejection import residual_distribution


def greedy_loop(draft: torch.Tensor, logits: torch.Tensor) -> list[list[int]]:
    """Greedy verification, row by row and position by position."""
    out = []
    for b in range(draft.shape[0]):
        row = []
        for i in range(draft.shape[1] + 1):
            best = int(logits[b, i].argmax())
            row.append(best)
            if i == draft.shape[1] or int(draft[b, i]) != best:
                break
        out.append(row)
    return out


def sampling_loop(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: torch.Generator) -> list[list[int]]:
    """Speculative sampling, row by row and position by position."""
    out = []
    gamma = draft.shape[1]
    for b in range(draft.shape[0]):
        row = []
        for i in range(gamma):
            y = int(draft[b, i])
            if float(torch.rand((), generator=generator)) * q[b, i, y].item() < p[b, i, y].item():
                row.append(y)
                continue
            row.append(int(torch.multinomial(residual_distribution(p[b, i], q[b, i]), 1, generator=generator)))
            break
        else:
            row.append(int(torch.multinomial(p[b, gamma], 1, generator=generator)))
        out.append(row)
    return out


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of fn() over repeats runs, after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(B: int = 64, gamma: int = 4, V: int = 32000, repeats: int = 5, seed: int = 0,
            sampling: bool = True) -> dict[str, float]:
    """Median seconds of the loops and the batched verifiers, and the ratios, in one run (greedy only with
    ``sampling=False``: notebook 02 comes before the sampling verifier).

    Both run on one CPU thread: PyTorch's thread pool adds a fixed cost to every small
    operation that varies from machine to machine and would swamp the comparison."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _compare(B, gamma, V, repeats, seed, sampling)
    finally:
        torch.set_num_threads(threads)


def _compare(B: int, gamma: int, V: int, repeats: int, seed: int, sampling: bool) -> dict[str, float]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, gamma + 1, V, generator=g)
    p = torch.softmax(logits.double(), -1)
    q = torch.softmax(logits[:, :gamma].double() + 0.5 * torch.randn(B, gamma, V, generator=g, dtype=torch.float64), -1)
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, gamma)
    greedy_draft = logits[:, :gamma].argmax(-1)
    greedy_draft[:, gamma // 2] = (greedy_draft[:, gamma // 2] + 1) % V  # reject midway, so loops stop early
    result = {
        "greedy_loop_s": median_time(lambda: greedy_loop(greedy_draft, logits), repeats),
        "greedy_batched_s": median_time(lambda: greedy_verify_batched(greedy_draft, logits), repeats),
    }
    result["greedy_ratio"] = result["greedy_loop_s"] / result["greedy_batched_s"]
    if sampling:
        result["sampling_loop_s"] = median_time(lambda: sampling_loop(p, q, draft, g), repeats)
        result["sampling_batched_s"] = median_time(lambda: verify_chain_batched(p, q, draft, g), repeats)
        result["sampling_ratio"] = result["sampling_loop_s"] / result["sampling_batched_s"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--V", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    r = compare(args.B, args.gamma, args.V, args.repeats)
    print(f"B={args.B} gamma={args.gamma} V={args.V} (median of {args.repeats}, one thread)")
    for kind in ("greedy", "sampling"):
        print(f"{kind:9s} loop {r[f'{kind}_loop_s'] * 1e3:9.2f} ms   batched {r[f'{kind}_batched_s'] * 1e3:8.2f} ms   "
              f"ratio {r[f'{kind}_ratio']:6.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
