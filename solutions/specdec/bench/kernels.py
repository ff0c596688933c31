"""GPU benchmark of the fused chain verifier (not a test; needs a CUDA GPU).

``python -m specdec.bench.kernels`` (``make bench-kernels``) times ``verify_chain_fused``
against its PyTorch specification at B in {1, 8, 64}, gamma = 4, V in {32000, 128256}, for
sampling rows and for greedy rows, and reports achieved bandwidth on the bytes the fused
kernel reads: a sampling row reads p[k], q[k] and the noise (3 V floats; its accept tests
are 2 gamma scalar loads), a greedy row the argmax of each of its gamma rows of p plus the
final pass over p[k], q[k] and the noise ((gamma + 3) V floats). The floor is those bytes
divided by the peak bandwidth (from data/gpus.json, matched on the device name, or
--peak-gbs); the PyTorch reference reads all of p and q, (2 gamma + 1) V floats per row,
several times over. Without a GPU it says so and exits 0: the kernels still run on CPU in
Triton's interpreter (tests/test_kernels.py), but interpreter timings mean nothing.
"""

from __future__ import annotations

import argparse

import torch


def peak_bandwidth(name: str) -> float | None:
    """The device's peak bandwidth in bytes/s from data/gpus.json, matched on its name (None: unknown or ambiguous)."""
    from specdec.tables import load_gpus

    matches = [gpu for gpu_name, gpu in load_gpus().items() if gpu_name.split()[0].lower() in name.lower()]
    return matches[0].bandwidth if len(matches) == 1 else None  # "H100" matches one row; ambiguous: ask


def measure(peak: float | None, Vs: tuple[int, ...] = (32000, 128256), Bs: tuple[int, ...] = (1, 8, 64),
            gamma: int = 4) -> list[dict]:
    """One row per (V, B, rows' kind) on the CUDA GPU: the fused verifier and the PyTorch specification timed
    (``triton.testing.do_bench``), equal outputs checked first, and the fused kernel's achieved bandwidth."""
    import triton.testing

    from specdec.checks.kernels import verify_inputs
    from specdec.kernels import verify_chain_fused, verify_chain_reference

    rows = []
    for V in Vs:
        for B in Bs:
            for mode in ("sampling", "greedy"):
                args = [t.cuda() for t in verify_inputs(B, gamma, V, seed=B)]
                args[5][:] = mode == "greedy"
                if not all(torch.equal(a, b) for a, b in zip(verify_chain_fused(*args), verify_chain_reference(*args))):
                    raise AssertionError(f"V={V} B={B} {mode}: the fused verifier differs from its PyTorch specification")
                fused = triton.testing.do_bench(lambda: verify_chain_fused(*args, validate=False)) * 1e-3
                reference = triton.testing.do_bench(lambda: verify_chain_reference(*args)) * 1e-3
                nbytes = B * V * 4 * (3 if mode == "sampling" else gamma + 3)
                rows.append({"V": V, "B": B, "rows": mode, "fused_us": fused * 1e6, "pytorch_us": reference * 1e6,
                             "speedup": reference / fused, "bytes": nbytes, "achieved_gbs": nbytes / fused / 1e9,
                             "fraction_of_peak": nbytes / fused / peak if peak else None,
                             "floor_us": nbytes / peak * 1e6 if peak else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-gbs", type=float, help="peak memory bandwidth in GB/s (default: from data/gpus.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("No CUDA GPU here: nothing to benchmark. The kernels run on the CPU under TRITON_INTERPRET=1 "
              "(see tests/test_kernels.py); their speed is measured only on a GPU.")
        return 0
    name = torch.cuda.get_device_name()
    peak = args.peak_gbs * 1e9 if args.peak_gbs else peak_bandwidth(name)
    print(f"{name}: peak bandwidth {peak / 1e9:.0f} GB/s" if peak else f"{name}: peak bandwidth unknown (--peak-gbs)")
    for row in measure(peak):
        line = (f"V={row['V']:6d} B={row['B']:2d} {row['rows']:8s}: fused {row['fused_us']:8.1f} us, PyTorch "
                f"{row['pytorch_us']:8.1f} us ({row['speedup']:5.1f}x), {row['achieved_gbs']:7.0f} GB/s")
        if peak:
            line += f" = {100 * row['fraction_of_peak']:5.1f}% of peak (floor {row['floor_us']:.1f} us)"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
