"""``make gpu-check`` on machines this one is not: a GPU that torch cannot use fails the run, a missing Triton
prerequisite fails it with its fix, the peak bandwidth is the device's own or given, and a stage's clock stops only
after the GPU has finished its work. Probes and devices are faked; the compile stage's own tests are in
test_compiled.py."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch

from specdec.bench import gpu_check, kernels as bench_kernels

PROBES = ("ptxas", "c_compiler", "python_headers", "libcuda")


@pytest.fixture
def machine(monkeypatch):
    """No NVIDIA GPU, every prerequisite found, the compile stage stubbed: each test changes what it needs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_check, "nvidia_gpu", lambda: None)
    for probe in PROBES:
        monkeypatch.setattr(gpu_check, probe, lambda probe=probe: f"/found/{probe}")
    monkeypatch.setattr(gpu_check, "compile_stage", lambda: {"rows": []})
    return monkeypatch


def test_without_a_gpu_the_compile_stage_runs_the_rest_is_skipped_and_the_report_names_the_builds(machine, tmp_path):
    out = tmp_path / "gpu-check.json"
    assert gpu_check.main(["--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["stages"]) == list(gpu_check.STAGES) and gpu_check.STAGES[:2] == ("prerequisites", "compile")
    assert [s["status"] for s in report["stages"].values()] == ["passed", "passed"] + ["skipped"] * 4
    assert report["stages"]["prerequisites"]["checks"]["libcuda"]["needed"] is False
    assert (report["torch"], report["torch_cuda"]) == (torch.__version__, torch.version.cuda) and report["triton"]


@pytest.mark.parametrize("cuda, why", [(None, "CPU build"), ("12.8", "driver on your system is too old")])
def test_a_gpu_that_torch_cannot_use_fails_the_run_and_names_the_build(machine, tmp_path, capsys, cuda, why):
    def init():
        raise RuntimeError("The NVIDIA driver on your system is too old (found version 11040).")

    machine.setattr(gpu_check, "nvidia_gpu", lambda: "/dev/nvidia0 exists")
    machine.setattr(torch.version, "cuda", cuda)
    machine.setattr(torch.cuda, "init", init)
    out = tmp_path / "gpu-check.json"
    assert gpu_check.main(["--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert f"torch.version.cuda = {cuda}" in printed and torch.__version__ in printed and why in printed
    stages = json.loads(out.read_text())["stages"]
    assert stages["prerequisites"]["status"] == "failed" and "/dev/nvidia0" in stages["prerequisites"]["error"]


def test_the_gpu_probe_sees_a_device_file_or_nvidia_smi(tmp_path):
    assert gpu_check.nvidia_gpu((str(tmp_path / "nvidia[0-9]*"),), smi=str(tmp_path / "nvidia-smi")) is None
    (tmp_path / "nvidia0").touch()
    assert "nvidia0" in gpu_check.nvidia_gpu((str(tmp_path / "nvidia[0-9]*"),), smi="")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    assert "NVIDIA H100 80GB HBM3" in gpu_check.nvidia_gpu((), smi=str(smi))


@pytest.mark.parametrize("probe, fix", [("c_compiler", "build-essential"), ("python_headers", "python3-dev"),
                                        ("libcuda", "NVIDIA driver"), ("ptxas", "triton")])
def test_a_missing_prerequisite_fails_the_stage_on_a_gpu_machine_with_its_fix(machine, probe, fix):
    machine.setattr(torch.cuda, "is_available", lambda: True)
    machine.setattr(gpu_check, probe, lambda: None)
    result = gpu_check.run_stage("prerequisites", lambda: gpu_check.prerequisites_stage("/dev/nvidia0 exists"))
    assert result["status"] == "failed" and probe in result["error"] and fix in result["error"]


def test_without_a_gpu_only_ptxas_is_required(machine):
    for probe in ("c_compiler", "python_headers", "libcuda"):
        machine.setattr(gpu_check, probe, lambda: None)
    checks = gpu_check.prerequisites_stage(None)["checks"]
    assert {name: (c["found"], c["needed"]) for name, c in checks.items()} == {
        "ptxas": ("/found/ptxas", True), "c_compiler": (None, False), "python_headers": (None, False),
        "libcuda": (None, False)}
    machine.setattr(gpu_check, "ptxas", lambda: None)
    with pytest.raises(RuntimeError, match="ptxas"):
        gpu_check.prerequisites_stage(None)


def test_the_real_probes_answer_a_path_or_none():
    found = {probe: getattr(gpu_check, probe)() for probe in PROBES}
    assert all(path is None or isinstance(path, str) for path in found.values()), found
    if importlib.util.find_spec("triton"):  # find_spec, not import: specdec.kernels must import Triton first
        assert found["ptxas"] and found["ptxas"].endswith("ptxas")


@pytest.mark.parametrize("device, peak", [("NVIDIA H100 80GB HBM3", 3.35e12), ("NVIDIA H200", 4.8e12),
                                          ("NVIDIA A100-SXM4-80GB", 2.039e12), ("NVIDIA L4", 3.0e11),
                                          ("NVIDIA GeForce RTX 4090", 1.008e12)])
def test_a_device_gets_the_peak_of_its_own_entry(device, peak):
    assert bench_kernels.peak_bandwidth(device) == peak


@pytest.mark.parametrize("device", ["NVIDIA H100 PCIe", "NVIDIA L40S", "NVIDIA A100-SXM4-40GB", "NVIDIA H200 NVL",
                                    "NVIDIA H100 80GB HBM3 MIG 1g.10gb"])
def test_a_device_without_its_own_entry_needs_its_peak_given(device):
    with pytest.raises(ValueError, match=r"--peak-tbps.*PEAK="):
        bench_kernels.peak_bandwidth(device)
    assert bench_kernels.peak_bandwidth(device, peak_tbps=2.0) == 2.0e12


def test_a_given_peak_wins():
    assert bench_kernels.peak_bandwidth("NVIDIA H100 80GB HBM3", peak_tbps=3.0) == 3.0e12


def test_the_peak_given_to_gpu_check_reaches_the_bandwidth_stage(machine, tmp_path):
    machine.setattr(torch.cuda, "is_available", lambda: True)
    machine.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA L40S")
    machine.setattr(gpu_check, "nvidia_gpu", lambda: "/dev/nvidia0 exists")
    for stage in ("kernels_stage", "engine_stage", "serving_stage"):
        machine.setattr(gpu_check, stage, lambda *args, **kwargs: {})
    machine.setattr(bench_kernels, "measure", lambda peak: [{"fraction_of_peak": 0.5}])
    out = tmp_path / "gpu-check.json"
    assert gpu_check.main(["--out", str(out)]) == 1
    error = json.loads(out.read_text())["stages"]["bandwidth"]["error"]
    assert "NVIDIA L40S" in error and "--peak-tbps" in error and "make gpu-check PEAK=" in error
    assert gpu_check.main(["--out", str(out), "--peak-tbps", "0.864"]) == 0
    assert json.loads(out.read_text())["stages"]["bandwidth"]["peak_bandwidth"] == 0.864e12


def test_bench_kernels_stops_at_an_unknown_gpu_and_takes_a_given_peak(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H100 PCIe")
    monkeypatch.setattr(bench_kernels, "measure", lambda peak: [])
    with pytest.raises(SystemExit):
        bench_kernels.main([])
    assert "--peak-tbps" in capsys.readouterr().err
    assert bench_kernels.main(["--peak-tbps", "2.0"]) == 0
    assert "2.00 TB/s" in capsys.readouterr().out


def test_a_stage_waits_for_the_gpu_before_its_clock_stops(monkeypatch):
    events = []
    monkeypatch.setattr(gpu_check, "time", SimpleNamespace(perf_counter=lambda: events.append("clock") or 0.0))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: events.append("synchronize"))
    assert gpu_check.run_stage("kernels", lambda: events.append("work") or {})["status"] == "passed"
    assert events == ["clock", "work", "synchronize", "clock"]
