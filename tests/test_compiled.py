"""Notebook 08's kernels through the whole GPU compiler (PTX, then the wheel's ptxas to a cubin for sm_80 and sm_90,
no GPU needed): what the report says is what the cubin holds, a spill shows up when there is one, the traffic model
is what the interpreter loads, and ``make gpu-check``'s stages run (on a CPU, at small shapes, where they can)."""

from __future__ import annotations

import json

import pytest
import torch

from specdec import kernels
from specdec.bench import compiled, gpu_check
from specdec.course.instruments import loads_counted
from specdec.tables import load_gpus
from specdec.tree import DEFAULT_CHOICES, flatten_tree, tree_mask

#: Shared memory one block may use (CUDA C Programming Guide, compute capabilities table): 163 KB on sm_80, 227 KB
#: on sm_90.
MAX_SHARED = {"sm_80": 163 * 1024, "sm_90": 227 * 1024}


@pytest.fixture(scope="module")
def answers() -> dict[str, dict]:
    return compiled.run_compiler(compiled.reference_kernels())


def test_every_reference_kernel_compiles_to_a_cubin_for_a100_and_h100(answers):
    rows, missing = compiled.report(compiled.reference_kernels(), answers)
    assert missing == {}
    assert sorted((r.kernel, r.arch) for r in rows) == sorted((k, a) for k in compiled.KERNELS for a in ("sm_80", "sm_90"))
    gpus = load_gpus()
    for r in rows:
        assert 0 < r.registers <= 255 and r.shared_memory <= MAX_SHARED[r.arch] and r.cubin_bytes > 1000, r
        assert r.spill_bytes <= 16, f"{r.kernel} on {r.arch} spills {r.spill_bytes} bytes per thread"
        assert r.floor_us == pytest.approx((r.unique_bytes + r.written_bytes) / gpus[r.gpu].bandwidth * 1e6)
    text = compiled.format_report(rows)
    assert all(name in text for name in compiled.KERNELS) and "sm_80" in text and "sm_90" in text


def test_the_report_compiles_each_kernel_as_its_launcher_launches_it():
    assert compiled.LAUNCH_OPTIONS["tree_attention_kernel"] == {"num_warps": kernels.TREE_ATTENTION_NUM_WARPS}


def test_the_registers_reported_are_the_ones_the_driver_reads(answers):
    """ptxas's own log and the cubin's EIATTR_REGCOUNT (what cuFuncGetAttribute returns on a GPU) agree."""
    for name, answer in answers.items():
        for cap, got in answer["targets"].items():
            assert got["elf"] and got["registers"] == got["elf_registers"] > 0, (name, cap, got)


def test_a_register_cap_shows_up_as_spills():
    capped = compiled.run_compiler({"verify_chain_kernel": kernels.verify_chain_kernel}, capabilities=(90,),
                                   options={"maxnreg": 32})["verify_chain_kernel"]["targets"]["90"]
    assert capped["registers"] <= 32 and capped["spill_stores"] > 0 and capped["spill_loads"] > 0 and capped["stack_frame"] > 0


def test_a_kernel_the_compiler_rejects_gets_no_row_and_the_reason():
    from specdec.mistakes.kernels import _edited

    broken = _edited(kernels.race_kernel, "int_start", ('best, best_col = -float("inf"), 0', "best, best_col = 0, 0"))
    rows, missing = compiled.report({"race_kernel": broken})
    assert rows == [] and "Loop-carried variable best" in missing["race_kernel"]


def _race(w, e, _):
    return kernels.race(w, e, block_v=16)


def _lse(x, _):
    return kernels.logsumexp(x, block_v=16)


def _verify(p, q, draft, u, e, greedy, _):
    return kernels.verify_chain_fused(p, q, draft, u, e, greedy, block_v=16)


def _tree(q, k, v, mask, _):
    return kernels.tree_attention(q, k, v, mask, block_k=8)


def _inputs(name: str, g: torch.Generator) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    B, V, gamma = 3, 37, 3  # V not a multiple of the block: masked lanes must not count
    if name == "race_kernel":
        return {"w": torch.rand(B, V, generator=g), "e": kernels.exponential_noise(B, V, generator=g)}, {"B": B, "V": V}
    if name == "logsumexp_kernel":
        return {"x": torch.randn(B, V, generator=g)}, {"B": B, "V": V}
    if name == "verify_chain_kernel":
        p = torch.softmax(torch.randn(B, gamma + 1, V, generator=g), -1)
        q = torch.softmax(torch.randn(B, gamma, V, generator=g), -1)
        draft = torch.randint(V, (B, gamma), generator=g)
        inputs = {"p": p, "q": q, "draft": draft, "u": torch.rand(B, gamma, generator=g),
                  "e": kernels.exponential_noise(B, V, generator=g), "greedy": torch.zeros(B, dtype=torch.int32)}
        return inputs, {"B": B, "V": V, "GAMMA": gamma}
    tree = flatten_tree(DEFAULT_CHOICES)
    H, N, L, D = 2, len(tree.parents), 5, 8
    inputs = {"q": torch.randn(H, N, D, generator=g), "k": torch.randn(H, L + N, D, generator=g),
              "v": torch.randn(H, L + N, D, generator=g), "mask": tree_mask(tree.parents).to(torch.int8)}
    return inputs, {"H": H, "N": N, "L": L, "D": D}


LAUNCH = {"race_kernel": _race, "logsumexp_kernel": _lse, "verify_chain_kernel": _verify, "tree_attention_kernel": _tree}


@pytest.mark.parametrize("name", compiled.KERNELS)
def test_the_traffic_model_is_what_the_interpreter_loads(name):
    """The bytes the report puts in the floor, counted load by load at a small shape (masked-off lanes excluded)."""
    inputs, shape = _inputs(name, torch.Generator().manual_seed(1))
    with loads_counted(inputs) as counts:
        LAUNCH[name](*inputs.values(), None)
    loaded = sum(counts[key] * t.element_size() for key, t in inputs.items())
    assert loaded == compiled.traffic(name, **shape).loaded
    assert compiled.traffic(name, **shape).unique <= loaded


def test_gpu_check_without_a_gpu_runs_the_compile_report_and_says_what_needs_one(answers, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_check, "nvidia_gpu", lambda: None)  # no GPU at all (tests/test_gpu_check.py: one torch can't use)
    monkeypatch.setattr(compiled, "run_compiler", lambda *args, **kwargs: answers)  # compiled once per module
    out = tmp_path / "gpu-check.json"
    assert gpu_check.main(["--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["stages"]["compile"]["status"] == "passed" and len(report["stages"]["compile"]["rows"]) == 8
    assert report["stages"]["prerequisites"]["status"] == "passed"
    assert {n: s["status"] for n, s in report["stages"].items() if n not in ("prerequisites", "compile")} == dict.fromkeys(
        ("kernels", "bandwidth", "engine", "serving"), "skipped")
    assert "need a CUDA GPU" in capsys.readouterr().out


def test_gpu_check_stages_pass_on_a_cpu_at_small_shapes():
    """The GPU stages' own logic (kernels against references, speculative and serving output against target-only
    decoding), tried on the CPU so that the one GPU run is not their first."""
    device = torch.device("cpu")
    assert gpu_check.kernels_stage(device, gpu_check.CPU_SHAPES)["kernels"].keys() == set(compiled.KERNELS)
    assert gpu_check.engine_stage(device, n_tokens=16)["gammas"] == [1, 4, 8]
    assert gpu_check.serving_stage(device, n_requests=3, max_tokens=8, gammas=(3, 0))["steps"] > 0


def test_a_failing_stage_is_reported_and_the_others_still_run(monkeypatch):
    def broken(device, shapes):
        raise AssertionError("race_kernel differs")

    monkeypatch.setattr(gpu_check, "kernels_stage", broken)
    report = gpu_check.check(torch.device("cpu"), gpu_check.CPU_SHAPES, stages=("kernels", "engine"))
    assert report["stages"]["kernels"]["status"] == "failed" and "race_kernel differs" in report["stages"]["kernels"]["error"]
    assert report["stages"]["engine"]["status"] == "passed"
