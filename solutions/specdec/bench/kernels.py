"""GPU benchmark of the fused chain verifier (not a test; needs a CUDA GPU).

``python -m specdec.bench.kernels`` (``make bench-kernels``) times ``verify_chain_fused``
against its PyTorch specification at B in {1, 8, 64}, gamma = 4, V in {32000, 128256}, for
sampling rows and for greedy rows, and reports achieved bandwidth on the bytes the fused
kernel reads: a sampling row reads p[k], q[k] and the noise (3 V floats; its accept tests
are 2 gamma scalar loads), a greedy row the argmax of each of its gamma rows of p plus the
final pass over p[k], q[k] and the noise ((gamma + 3) V floats). The floor is those bytes
divided by the peak bandwidth (--peak-tbps, ``make bench-kernels PEAK=3.35``; else the
data/gpus.json entry that names this exact device, and none: it stops and asks for the
option); the PyTorch reference reads all of p and q, (2 gamma + 1) V floats per row,
several times over. Without a GPU it says so and exits 0: the kernels still run on CPU in
Triton's interpreter (tests/test_kernels.py), but interpreter timings mean nothing.
"""

from __future__ import annotations

import argparse

import torch


def peak_bandwidth(name: str, peak_tbps: float | None = None) -> float:
    """The peak bandwidth in bytes/s: ``peak_tbps`` when given, else that of the data/gpus.json entry whose
    ``device_names`` hold ``name`` (the full name: "NVIDIA H100 PCIe" is not the SXM); no such entry raises
    rather than guess."""
    from specdec.tables import gpu_for_device

    if peak_tbps is not None:
        if peak_tbps <= 0:
            raise ValueError(f"--peak-tbps must be a positive bandwidth in TB/s, got {peak_tbps}")
        return peak_tbps * 1e12
    gpu = gpu_for_device(name)
    if gpu is None:
        raise ValueError(f"no entry of data/gpus.json is the {name!r}: give its peak memory bandwidth in TB/s from "
                         "its datasheet with --peak-tbps (make gpu-check PEAK=3.35, make bench-kernels PEAK=3.35), "
                         "or add the name to an entry's device_names")
    return gpu.bandwidth


def measure(peak: float, Vs: tuple[int, ...] = (32000, 128256), Bs: tuple[int, ...] = (1, 8, 64),
            gamma: int = 4) -> list[dict]:
    """One row per (V, B, rows' kind) on the CUDA GPU: the fused verifier and the PyTorch specification timed
    (``triton.testing.do_bench``, which synchronises the device and times with CUDA events), equal outputs
    checked first, and the fused kernel's achieved bandwidth at ``peak`` bytes/s."""
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
                             "fraction_of_peak": nbytes / fused / peak, "floor_us": nbytes / peak * 1e6})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-tbps", type=float, help="peak memory bandwidth in TB/s (default: data/gpus.json's "
                        "entry for this exact device)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("No CUDA GPU here: nothing to benchmark. The kernels run on the CPU under TRITON_INTERPRET=1 "
              "(see tests/test_kernels.py); their speed is measured only on a GPU.")
        return 0
    name = torch.cuda.get_device_name()
    try:
        peak = peak_bandwidth(name, args.peak_tbps)
    except ValueError as err:
        parser.error(str(err))
    print(f"{name}: peak bandwidth {peak / 1e12:.2f} TB/s" + (" (given)" if args.peak_tbps is not None else " (data/gpus.json)"))
    for row in measure(peak):
        print(f"V={row['V']:6d} B={row['B']:2d} {row['rows']:8s}: fused {row['fused_us']:8.1f} us, PyTorch "
              f"{row['pytorch_us']:8.1f} us ({row['speedup']:5.1f}x), {row['achieved_gbs']:7.0f} GB/s = "
              f"{100 * row['fraction_of_peak']:5.1f}% of peak (floor {row['floor_us']:.1f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
