"""``make gpu-check``: everything in the course that needs a GPU, as one prepared run into one JSON report.

Stages, each recorded as passed, failed (with its error) or skipped (with why), and its seconds:

0. ``prerequisites``: what Triton needs beyond its wheel, each with its fix: the wheel's ``ptxas`` (stage 1, on any
   machine); with an NVIDIA GPU also a C compiler and Python's headers (Triton builds its launcher with them on the
   first launch), the driver's libcuda, and a torch that can use the GPU (a CPU build of torch, or a CUDA build on
   too old a driver, would otherwise skip every GPU stage and pass).
1. ``compile``: every reference kernel through the whole compiler for sm_80 and sm_90 (runs anywhere).
2. ``kernels``: the compiled kernels against their PyTorch references at the compile report's shapes.
3. ``bandwidth``: ``make bench-kernels``: the fused verifier's achieved bandwidth as a fraction of the device's peak
   (``--peak-tbps``, ``make gpu-check PEAK=3.35``; else data/gpus.json's entry for this exact device, and none: fails).
4. ``engine``: speculative decoding (notebook 05) on the GPU: greedy output equal to target-only decoding.
5. ``serving``: the serving engine (notebook 11) on the GPU, every request equal to target-only decoding.

Without an NVIDIA GPU, stages 0 and 1 run and the others say that they need one. The report also records the
versions of torch, its CUDA (None: a CPU build) and Triton. Expected time on one H100 or H200: well under the 5
minutes allowed (most of it the timing loops of ``bandwidth``).

    python -m specdec.bench.gpu_check [--out artifacts/gpu-check.json] [--peak-tbps 3.35]
"""

from __future__ import annotations

import argparse
import functools
import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from specdec.paths import REPO_ROOT

STAGES = ("prerequisites", "compile", "kernels", "bandwidth", "engine", "serving")
#: Each prerequisite: what it is and does, and its fix.
PREREQUISITES = {
    "ptxas": ("the assembler of PTX into a cubin, which stage 1 runs on any machine",
              "reinstall the triton wheel (Linux wheels ship ptxas), or set TRITON_PTXAS_PATH"),
    "c_compiler": ("$CC, else gcc, else clang, with which Triton builds its launcher module on the first launch",
                   "apt-get install build-essential, or set CC"),
    "python_headers": ("Python.h, which that launcher includes",
                       f"apt-get install python3-dev (python{sys.version_info[0]}.{sys.version_info[1]}-dev for this "
                       "Python)"),
    "libcuda": ("the driver's libcuda.so.1, which that launcher links, looked up with ldconfig -p, else in "
                "$LD_LIBRARY_PATH",
                "install the NVIDIA driver, then run ldconfig (or set TRITON_LIBCUDA_PATH)"),
}
#: The shapes stage 2 runs at: the compile report's on a GPU, a few small ones when the stages are tried on a CPU.
GPU_SHAPES = {"B": 64, "V": 128256, "GAMMA": 4, "H": 32, "N": 12, "L": 2048, "D": 128}
CPU_SHAPES = {"B": 5, "V": 300, "GAMMA": 3, "H": 2, "N": 12, "L": 9, "D": 16}


def nvidia_gpu(patterns: tuple[str, ...] = ("/proc/driver/nvidia/gpus/*", "/dev/nvidia[0-9]*"),
               smi: str = "nvidia-smi") -> str | None:
    """What shows an NVIDIA GPU on this machine, whether or not torch can use it; None when nothing does."""
    for pattern in patterns:
        if found := sorted(glob.glob(pattern)):
            return f"{found[0]} exists"
    if smi and (path := shutil.which(smi)):
        try:
            listed = subprocess.run([path, "-L"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            listed = ""
        if gpus := [line.strip() for line in listed.splitlines() if line.startswith("GPU ")]:
            return f"nvidia-smi -L lists {gpus[0]}"
    return None


def torch_cuda_problem(gpu: str | None) -> str | None:
    """Why torch cannot use the NVIDIA GPU that ``gpu`` (:func:`nvidia_gpu`) shows; None when it can or there is none."""
    if gpu is None or torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        why = (f"this torch is a CPU build (a CPU wheel index?): install torch=={torch.__version__.split('+')[0]} "
               "from a CUDA wheel index whose CUDA the driver supports (nvidia-smi shows the newest it does)")
    else:
        try:
            torch.cuda.init()
            why = "CUDA starts but finds no device"
        except Exception as err:  # torch's own reason: no driver, a driver too old, no device visible
            why = f"a CUDA {torch.version.cuda} build, but CUDA does not start: {err}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"{gpu}, but torch {torch.__version__} (torch.version.cuda = {torch.version.cuda}) cannot use it: {why}"
            + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""))


def ptxas() -> str | None:
    """The ptxas Triton compiles with, if it runs: $TRITON_PTXAS_PATH, else the wheel's (found without importing
    Triton, which specdec.kernels must import first)."""
    spec = importlib.util.find_spec("triton")
    wheel = [os.path.join(d, "backends", "nvidia", "bin", "ptxas") for d in (spec and spec.submodule_search_locations or ())]
    for path in filter(None, [os.environ.get("TRITON_PTXAS_PATH"), *wheel]):
        try:
            if "release" in subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout:
                return path
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def c_compiler() -> str | None:
    """The C compiler Triton would build its launcher with: $CC, else gcc, else clang (triton/runtime/build.py)."""
    cc = os.environ.get("CC")
    return shutil.which(cc) if cc else shutil.which("gcc") or shutil.which("clang")


def python_headers() -> str | None:
    """Python.h where Triton looks: sysconfig's include path (Debian's posix_local scheme read as posix_prefix)."""
    scheme = sysconfig.get_default_scheme()
    header = os.path.join(sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"],
                          "Python.h")
    return header if os.path.exists(header) else None


def libcuda() -> str | None:
    """libcuda.so.1 where Triton looks (triton/backends/nvidia/driver.py): $TRITON_LIBCUDA_PATH, else the linker
    cache (``ldconfig -p``), else $LD_LIBRARY_PATH; None when it is in none of them or does not load."""
    import ctypes

    dirs = [os.environ["TRITON_LIBCUDA_PATH"]] if os.environ.get("TRITON_LIBCUDA_PATH") else []
    if not dirs:
        try:
            cache = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            cache = ""
        dirs = [os.path.dirname(line.split()[-1]) for line in cache.splitlines() if "libcuda.so.1" in line]
        dirs = dirs or os.environ.get("LD_LIBRARY_PATH", "").split(":")
    for path in [os.path.join(d, "libcuda.so.1") for d in dirs if d]:
        try:
            ctypes.CDLL(path)
            return path
        except OSError:
            continue
    return None


def prerequisites_stage(gpu: str | None) -> dict:
    """Each of PREREQUISITES found or not; with ``gpu`` (an NVIDIA GPU is here) all are needed and torch must be
    able to use it, without one only ptxas is (stage 1 compiles, nothing launches). Raises naming what is missing
    and its fix."""
    probes = {"ptxas": ptxas, "c_compiler": c_compiler, "python_headers": python_headers, "libcuda": libcuda}
    checks = {name: {"found": probe(), "needed": gpu is not None or name == "ptxas", "for": PREREQUISITES[name][0],
                     "fix": PREREQUISITES[name][1]} for name, probe in probes.items()}
    for name, c in checks.items():
        print(f"  {name}: {c['found'] or 'missing' + ('' if c['needed'] else ' (not needed without a GPU)')}")
    missing = [f"{name} missing ({c['for']}); fix: {c['fix']}" for name, c in checks.items()
               if c["needed"] and not c["found"]]
    if problem := torch_cuda_problem(gpu):
        missing.insert(0, problem)
    if missing:
        raise RuntimeError("; ".join(missing))
    return {"gpu": gpu, "checks": checks}


def triton_version() -> str:
    """Triton's installed version (read without importing it), or 'absent'."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


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


def bandwidth_stage(peak_tbps: float | None = None) -> dict:
    """``make bench-kernels`` at ``peak_tbps`` (else data/gpus.json's entry for this exact device; none: raises)."""
    from specdec.bench.kernels import measure, peak_bandwidth

    peak = peak_bandwidth(torch.cuda.get_device_name(), peak_tbps)
    rows = measure(peak)
    print(f"fused verifier: best {100 * max(r['fraction_of_peak'] for r in rows):.0f}% of {peak / 1e12:.2f} TB/s")
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
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the GPU's queued work (and any error it raises) belongs to this stage
    except Exception as err:  # a failed stage is reported and the next one still runs
        result = {"status": "failed", "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    result["seconds"] = round(time.perf_counter() - start, 2)
    print(f"[{name}] {result['status']} in {result['seconds']} s" + (f": {result['error']}" if "error" in result else ""))
    return result


def check(device: torch.device | None = None, shapes: dict[str, int] | None = None,
          stages: tuple[str, ...] = STAGES, peak_tbps: float | None = None) -> dict:
    """Run the stages; without a CUDA GPU torch can use, everything but ``prerequisites`` and ``compile`` is skipped
    unless ``device`` is given, which is how the tests try stages 2, 4 and 5 on a CPU at small shapes. An NVIDIA
    GPU that torch cannot use fails ``prerequisites``."""
    cuda = torch.cuda.is_available()
    gpu = nvidia_gpu() or (f"torch sees {torch.cuda.get_device_name()}" if cuda else None)
    device = device or (torch.device("cuda") if cuda else None)
    shapes = shapes or (GPU_SHAPES if cuda else CPU_SHAPES)
    work = {"prerequisites": lambda: prerequisites_stage(gpu), "compile": compile_stage,
            "kernels": lambda: kernels_stage(device, shapes), "bandwidth": lambda: bandwidth_stage(peak_tbps),
            "engine": lambda: engine_stage(device), "serving": lambda: serving_stage(device)}
    cpu = "an NVIDIA GPU that torch cannot use" if gpu else "no CUDA GPU"
    report = {"device": torch.cuda.get_device_name() if cuda else f"{cpu} ({platform.processor() or 'CPU'})",
              "nvidia_gpu": gpu, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
              "triton": triton_version(), "stages": {}}
    why = "needs a CUDA GPU" + (" that torch can use (see prerequisites)" if gpu else "")
    for name in stages:
        needs_gpu = name == "bandwidth" or (name not in ("prerequisites", "compile") and device is None)
        if needs_gpu and not cuda:
            report["stages"][name] = {"status": "skipped", "why": why}
            print(f"[{name}] skipped: {why}")
            continue
        report["stages"][name] = run_stage(name, work[name])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "artifacts" / "gpu-check.json")
    parser.add_argument("--peak-tbps", type=float, help="the GPU's peak memory bandwidth in TB/s (default: "
                        "data/gpus.json's entry for this exact device; none: the bandwidth stage fails)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    report = check(peak_tbps=args.peak_tbps)
    report["seconds"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    statuses = [s["status"] for s in report["stages"].values()]
    print(f"{report['device']}: " + ", ".join(f"{n} {s['status']}" for n, s in report["stages"].items())
          + f" in {report['seconds']} s; report: {args.out}")
    if report["nvidia_gpu"] and "skipped" in statuses:
        print(f"This machine has an NVIDIA GPU that torch cannot use: {report['stages']['prerequisites'].get('error')}")
    elif "skipped" in statuses:
        print("The stages that were skipped need a CUDA GPU: run `make gpu-check` there (about a minute).")
    return 1 if "failed" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
