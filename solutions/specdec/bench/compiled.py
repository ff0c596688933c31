"""Notebook 08's kernels through the whole GPU compiler, on any machine, GPU or not.

Triton lowers a kernel to its IR, then to PTX, and the ``ptxas`` that Triton's wheel ships turns the
PTX into a cubin for one GPU generation: sm_80 (A100) and sm_90 (H100, H200). That last step decides
what a profiler later shows: registers per thread (more registers, fewer warps resident per SM),
spills (registers that did not fit, stored to local memory, which lives in DRAM behind the caches),
and the shared memory Triton reserves for its reductions. None of it needs a GPU.

Beside that, the bytes one launch moves at the shapes notebook 08 names, and the time that traffic
takes at each GPU's bandwidth (``data/gpus.json``): the floor a memory-bound kernel can approach.

    python -m specdec.bench.compiled [--json PATH]    # the reference kernels' report
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec.tables import load_gpus

KERNELS = ("race_kernel", "logsumexp_kernel", "verify_chain_kernel", "tree_attention_kernel")
#: The GPUs of the report, as named in data/gpus.json, and their compute capability.
TARGETS = {"A100 80GB": 80, "H100 SXM": 90}

#: Argument types and the compile-time constants the launchers pick at the report's shapes.
SIGNATURES = {
    "race_kernel": ({"w_ptr": "*fp32", "e_ptr": "*fp32", "out_ptr": "*i64", "V": "i32", "BLOCK_V": "constexpr"},
                    {"BLOCK_V": 1024}),
    "logsumexp_kernel": ({"x_ptr": "*fp32", "out_ptr": "*fp32", "V": "i32", "BLOCK_V": "constexpr"}, {"BLOCK_V": 1024}),
    "verify_chain_kernel": ({"p_ptr": "*fp32", "q_ptr": "*fp32", "draft_ptr": "*i64", "u_ptr": "*fp32", "e_ptr": "*fp32",
                             "greedy_ptr": "*i32", "tokens_ptr": "*i64", "counts_ptr": "*i64", "V": "i32",
                             "GAMMA": "constexpr", "BLOCK_V": "constexpr"}, {"GAMMA": 4, "BLOCK_V": 1024}),
    "tree_attention_kernel": ({"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "mask_ptr": "*i8", "out_ptr": "*fp32",
                               "N": "i32", "L": "i32", "D": "i32", "scale": "fp32", "BLOCK_K": "constexpr",
                               "BLOCK_D": "constexpr"}, {"BLOCK_K": 64, "BLOCK_D": 128}),
}

#: Launch options the course's launchers pass (``specdec.kernels.TREE_ATTENTION_NUM_WARPS``), compiled the same way.
LAUNCH_OPTIONS = {"tree_attention_kernel": {"num_warps": 8}}

#: The shape of one launch per kernel: notebook 08's ledger (B = 64 sequences, Llama 3's V = 128,256, gamma = 4,
#: sampling rows) and, for tree attention, one layer of a 7B target (32 heads of 128) over 2,048 tokens of context
#: with the default 12-node tree.
SHAPES = {"race_kernel": {"B": 64, "V": 128256}, "logsumexp_kernel": {"B": 64, "V": 128256},
          "verify_chain_kernel": {"B": 64, "V": 128256, "GAMMA": 4},
          "tree_attention_kernel": {"H": 32, "N": 12, "L": 2048, "D": 128}}


@dataclass(frozen=True)
class Traffic:
    """Bytes of one launch: ``loaded`` by all programs together (what the load instructions ask for), ``unique``
    (each input byte once: the DRAM floor when programs that share data meet in the L2 cache) and ``written``."""

    loaded: int
    unique: int
    written: int


def traffic(name: str, B: int = 0, V: int = 0, GAMMA: int = 0, H: int = 0, N: int = 0, L: int = 0,
            D: int = 0) -> Traffic:
    """The traffic of the statement's one-pass kernel ``name`` (float32 data, int64 tokens; sampling rows for the
    verifier: a greedy row also reads GAMMA whole rows of p for its argmaxes)."""
    if name == "race_kernel":  # w and e, one row each per program; one index out
        return Traffic(2 * B * V * 4, 2 * B * V * 4, B * 8)
    if name == "logsumexp_kernel":
        return Traffic(B * V * 4, B * V * 4, B * 4)
    if name == "verify_chain_kernel":
        # per row: the greedy flag; per draft: its id, u, q and p at it; then p[k], q[k] and e over V in one pass;
        # the drafts once more to write the tokens
        per_row = 4 + GAMMA * (8 + 4 + 4 + 4) + 3 * V * 4 + GAMMA * 8
        unique = 4 + GAMMA * (8 + 4) + 3 * V * 4  # p[k, y] and q[k, y] lie in rows read anyway (at most 2 more)
        return Traffic(B * per_row, B * unique, B * (GAMMA + 1) * 8 + B * 8)
    if name == "tree_attention_kernel":
        # one program per (head, node): its query, every key and value of its head (a masked-off tree key is loaded
        # all the same), its row of the tree mask
        per_program = D * 4 + 2 * (L + N) * D * 4 + N
        unique = H * (N * D * 4 + 2 * (L + N) * D * 4) + N * N
        return Traffic(H * N * per_program, unique, H * N * D * 4)
    raise ValueError(f"no traffic model for {name!r}; kernels: {', '.join(KERNELS)}")


# Runs in a fresh interpreter with TRITON_INTERPRET=0 (the interpreter must be off before Triton loads). Request:
# {"stage": "ir" or "cubin", "capabilities": [...], "kernels": [{"name", "source", "signature", "constants"}]}.
# Answer per kernel: {"skipped": why} (cannot be judged alone), {"error": the compiler's message}, or per capability
# the cubin's registers, spills, stack frame, shared memory and size ("ir": {"ok": true}, the front end for sm_90).
_COMPILE = r"""
import contextlib, io, json, linecache, os, re, sys, tempfile
os.environ["TRITON_INTERPRET"] = "0"
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # never a cached cubin: ptxas must run and report
os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, said aloud (no warning)
request = json.load(sys.stdin)
try:
    import triton, triton.language as tl
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource
except Exception as err:  # no NVIDIA back end in this Triton build
    print(json.dumps({k["name"]: {"skipped": repr(err)} for k in request["kernels"]})); sys.exit(0)

def elf_registers(cubin):
    # registers per thread as the driver reads them: EIATTR_REGCOUNT (0x2f) in the cubin's .nv.info section,
    # an entry of format EIFMT_SVAL (4) holding (function symbol, registers)
    import struct
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    for header in headers:
        if cubin[names + header[0]:cubin.index(b"\0", names + header[0])] != b".nv.info":
            continue
        data, at = cubin[header[4]:header[4] + header[5]], 0
        while at < len(data):
            form, attribute = data[at], data[at + 1]
            size = struct.unpack_from("<H", data, at + 2)[0] if form == 4 else 0
            if attribute == 0x2F and form == 4:
                return struct.unpack_from("<II", data, at + 4)[1]
            at += 4 + size
    return None

def number(pattern, log):
    found = re.search(pattern, log)
    return int(found.group(1)) if found else None

def one(kernel):
    name = "<" + kernel["name"] + ">"
    linecache.cache[name] = (len(kernel["source"]), None, kernel["source"].splitlines(True), name)
    namespace = {"triton": triton, "tl": tl}
    try:
        exec(compile(kernel["source"], name, "exec"), namespace)
        fn = namespace[kernel["name"]]
    except NameError as err:  # the kernel's cell uses names from elsewhere in the notebook
        return {"skipped": repr(err)}
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"[-1200:]}
    signature, constants = kernel["signature"], kernel["constants"]
    source = ASTSource(fn, signature, {(list(signature).index(k),): v for k, v in constants.items()})
    answer = {}
    for cap in request["capabilities"]:
        target = GPUTarget("cuda", cap, 32)
        log = io.StringIO()
        try:
            if request["stage"] == "ir":
                backend = CUDABackend(target)
                options = backend.parse_options({})
                context = ir.context(); ir.load_dialects(context); backend.load_dialects(context)
                source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                               context)
                answer[str(cap)] = {"ok": True}
                continue
            with contextlib.redirect_stdout(log):
                compiled = triton.compile(source, target=target, options=kernel.get("options"))
        except Exception as err:
            message = str(err)
            if "is not defined" in message:  # a helper defined in another cell
                return {"skipped": message[-300:]}
            return {"error": message.strip()[-1200:]}
        log = log.getvalue()
        answer[str(cap)] = {
            "registers": number(r"Used (\d+) registers", log),
            "elf_registers": elf_registers(compiled.asm["cubin"]),
            "spill_stores": number(r"(\d+) bytes spill stores", log),
            "spill_loads": number(r"(\d+) bytes spill loads", log),
            "stack_frame": number(r"(\d+) bytes stack frame", log),
            "shared_memory": compiled.metadata.shared, "num_warps": compiled.metadata.num_warps,
            "cubin_bytes": len(compiled.asm["cubin"]), "elf": compiled.asm["cubin"][:4] == b"\x7fELF"}
    return {"targets": answer}

print(json.dumps({kernel["name"]: one(kernel) for kernel in request["kernels"]}))
"""


def kernel_source(kernel: Callable) -> str | None:
    """The source of a ``@triton.jit`` kernel (a notebook cell's too), or None when it cannot be found."""
    try:
        return inspect.getsource(kernel.fn)
    except (OSError, TypeError, AttributeError):  # a kernel graded from outside its sandbox carries its source
        source = getattr(kernel, "src", None)
        return source if isinstance(source, str) else None


def run_compiler(kernels: dict[str, Callable], stage: str = "cubin", capabilities: Sequence[int] = (80, 90),
                 wrap: Callable[[list[str], dict], list[str]] = lambda command, env: command,
                 options: dict | None = None, timeout: float = 300) -> dict[str, dict]:
    """Compile ``{exercise name: kernel}`` in a fresh interpreter; the answer per name (see ``_COMPILE``).
    ``wrap`` turns the command into the one to run (the grader runs it in the learner's sandbox); ``options`` go
    to ``triton.compile`` (``{"maxnreg": 32}`` caps the registers)."""
    requests, answers = [], {}
    for name, kernel in kernels.items():
        source = kernel_source(kernel)
        if source is None:
            answers[name] = {"skipped": "no source"}
            continue
        signature, constants = SIGNATURES[name]
        requests.append({"name": kernel.fn.__name__, "exercise": name, "source": source, "signature": signature,
                         "constants": constants, "options": {**LAUNCH_OPTIONS.get(name, {}), **(options or {})}})
    if not requests:
        return answers
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    message = json.dumps({"stage": stage, "capabilities": list(capabilities), "kernels": requests})
    try:
        done = subprocess.run(wrap([sys.executable, "-c", _COMPILE], {"TRITON_INTERPRET": "0"}), input=message,
                              capture_output=True, text=True, timeout=timeout, env=env)
        by_function = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
        return {**answers, **{r["exercise"]: {"skipped": "the compiler did not answer"} for r in requests}}
    return {**answers, **{r["exercise"]: by_function[r["name"]] for r in requests}}


@dataclass(frozen=True)
class ReportRow:
    """One kernel on one GPU: what ptxas decided, and the launch's traffic at its shape."""

    kernel: str
    gpu: str
    arch: str
    registers: int
    spill_bytes: int  # spill stores + spill loads, bytes per thread
    stack_frame: int
    shared_memory: int
    num_warps: int
    cubin_bytes: int
    shape: str
    loaded_bytes: int
    unique_bytes: int
    written_bytes: int
    floor_us: float  # (unique + written) bytes / the GPU's bandwidth


def report(kernels: dict[str, Callable], answers: dict[str, dict] | None = None
           ) -> tuple[list[ReportRow], dict[str, str]]:
    """The compile report of ``{exercise name: kernel}`` for every GPU of TARGETS, and why a kernel has no row
    (``answers``: :func:`run_compiler`'s, when the caller compiled already)."""
    gpus = load_gpus()
    answers = answers or run_compiler(kernels, "cubin", sorted(set(TARGETS.values())))
    rows, missing = [], {}
    for name in kernels:
        answer = answers[name]
        if "targets" not in answer:
            missing[name] = answer.get("error") or answer.get("skipped", "not compiled")
            continue
        shape = SHAPES[name]
        moved = traffic(name, **shape)
        for gpu, cap in TARGETS.items():
            got = answer["targets"][str(cap)]
            rows.append(ReportRow(
                name, gpu, f"sm_{cap}", got["registers"], got["spill_stores"] + got["spill_loads"], got["stack_frame"],
                got["shared_memory"], got["num_warps"], got["cubin_bytes"],
                ", ".join(f"{k} = {v:,}" for k, v in shape.items()), moved.loaded, moved.unique, moved.written,
                (moved.unique + moved.written) / gpus[gpu].bandwidth * 1e6))
    return rows, missing


def format_report(rows: list[ReportRow], missing: dict[str, str] | None = None) -> str:
    """The report as a table, one line per kernel and GPU, then the kernels that did not compile."""
    header = (f"{'kernel':<22} {'GPU':<10} {'arch':<6} {'regs':>4} {'spills':>7} {'smem':>6}  {'loaded MB':>9} "
              f"{'unique MB':>9} {'floor us':>8}  shape")
    lines = [header] if rows else []
    for r in rows:
        lines.append(f"{r.kernel:<22} {r.gpu:<10} {r.arch:<6} {r.registers:>4} {r.spill_bytes:>6}B {r.shared_memory:>5}B"
                     f"  {r.loaded_bytes / 1e6:>9.2f} {r.unique_bytes / 1e6:>9.2f} {r.floor_us:>8.2f}  {r.shape}")
    for name, why in (missing or {}).items():
        if "NotImplementedError" in why:
            why = "not written yet (its skeleton raises NotImplementedError)"
        lines.append(f"{name}: no cubin. {why.strip().splitlines()[-1] if why.strip() else 'not compiled'}")
    return "\n".join(lines)


def reference_kernels() -> dict[str, Callable]:
    from specdec import kernels  # after the caller decided about TRITON_INTERPRET

    return {name: getattr(kernels, name) for name in KERNELS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the report here as JSON")
    args = parser.parse_args(argv)
    rows, missing = report(reference_kernels())
    print(format_report(rows, missing))
    gpus = load_gpus()
    print("bandwidth: " + "; ".join(f"{g} {gpus[g].bandwidth / 1e12:.3g} TB/s ({gpus[g].source})" for g in TARGETS))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": [asdict(r) for r in rows], "missing": missing}, indent=1) + "\n")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
