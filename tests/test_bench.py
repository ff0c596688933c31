"""The benchmark CLI runs end to end on tiny checkpoints and refuses bad input clearly."""

import json

import pytest

from specdec.bench.speculative import main
from specdec.models.checkpoints import save
from specdec.models.model import Llama, LlamaConfig


@pytest.fixture()
def models(tmp_path):
    for name, d_model in (("target", 64), ("draft", 32)):
        config = LlamaConfig(d_model=d_model, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=512)
        save(Llama(config), tmp_path / "models" / f"{name}.safetensors")
    return tmp_path / "models"


def test_bench_writes_results(models, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--models", str(models), "--gammas", "1", "3", "--prompts", "1", "--tokens", "8", "--repeats", "1",
            "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "bench.json").read_text())
    rows = summary["rows"]
    assert ({(r["task"], r["proposer"], r["gamma"]) for r in rows}
            == {(t, p, g) for t in ("code", "math") for p in ("draft", "lookup") for g in (1, 3)}
            | {(t, "tree", 4) for t in ("code", "math")})
    assert all(r["identical"] and r["speedup"] > 0 and 0 <= r["acceptance"] <= 1 for r in rows)
    assert summary["peak_rss_mib"] > 0
    assert (out / "bench.csv").read_text().startswith("task,proposer,gamma")
    assert (out / "bench.png").stat().st_size > 0


def test_bench_bad_input(models, tmp_path, capsys):
    assert main(["--models", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--models", str(models), "--gammas", "0"])
    assert "every gamma must be >= 1" in capsys.readouterr().err
    save(Llama(LlamaConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=96)),
         models / "draft.safetensors")
    assert main(["--models", str(models), "--out", str(tmp_path / "o")]) == 2
    assert "vocabulary" in capsys.readouterr().err


def test_bench_prompt_longer_than_context(tmp_path, capsys):
    config = LlamaConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=64)
    for name in ("target", "draft"):
        save(Llama(config), tmp_path / "m" / f"{name}.safetensors")
    assert main(["--models", str(tmp_path / "m"), "--prompts", "1", "--tokens", "8", "--out", str(tmp_path / "o")]) == 2
    assert "exceed the target's context of 64" in capsys.readouterr().err


def test_notebook_sweep_measures_once_then_reads_its_cache(models, tmp_path, monkeypatch):
    import specdec.bench.speculative as bench

    monkeypatch.setitem(bench.WORKLOADS, "tiny", {"prompts": 1, "tokens": 6, "gammas": [2], "repeats": 1})
    cache = tmp_path / "cache" / "tiny.json"
    first = bench.notebook_sweep("tiny", models, cache)
    assert cache.exists() and first["costs"]["verify_ratio"].keys() == {2}
    assert all(r["identical"] and r["rounds"] for r in first["rows"] if r["proposer"] != "lookup")
    monkeypatch.setattr(bench, "load_pair", lambda *a: pytest.fail("measured again instead of reading the cache"))
    assert bench.notebook_sweep("tiny", models, cache) == first
    with pytest.raises(ValueError, match="workload must be one of"):
        bench.notebook_sweep("huge", models, cache)


def test_shipped_notebook_reference_matches_the_full_workload():
    """data/bench/nb09_full.json is what notebook 09 reads: the full workload's rows, every output identical."""
    from specdec.bench.speculative import WORKLOADS
    from specdec.paths import DATA_DIR

    shipped = json.loads((DATA_DIR / "bench" / "nb09_full.json").read_text())
    config = shipped["config"]
    assert {k: config[k] for k in WORKLOADS["full"]} == WORKLOADS["full"]
    chains = [r for r in shipped["rows"] if r["proposer"] == "draft"]
    assert {(r["task"], r["gamma"]) for r in chains} == {(t, g) for t in ("code", "math") for g in config["gammas"]}
    assert all(r["identical"] and 0 < r["per_position_acceptance"] <= 1 for r in chains)


def test_notebook_reference_measures_the_control_draft_and_temperatures(models, tmp_path, monkeypatch):
    """--notebook-reference adds the undistilled control's runs and the acceptance at each temperature."""
    import specdec.bench.speculative as bench

    save(Llama(LlamaConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=512)),
         models / "draft_undistilled.safetensors")
    monkeypatch.setitem(bench.WORKLOADS, "full", {"prompts": 1, "tokens": 6, "gammas": [2], "repeats": 1})
    monkeypatch.setattr(bench, "CONTROL_GAMMAS", (2,))
    out = tmp_path / "ref.json"
    assert main(["--models", str(models), "--notebook-reference", str(out)]) == 0
    ref = json.loads(out.read_text())
    control = [r for r in ref["rows"] if r["proposer"] == "draft_undistilled"]
    assert {(r["task"], r["gamma"]) for r in control} == {("code", 2), ("math", 2)}
    assert all(r["identical"] and "rounds" not in r and 0 <= r["per_position_acceptance"] <= 1 for r in control)
    expected = ref["alignment"]["expected"]
    assert {(e["task"], e["draft"], e["temperature"]) for e in expected} == {
        (t, d, T) for t in ("code", "math") for d in ("draft", "draft_undistilled") for T in bench.TEMPERATURES}
    assert all(0 <= e["acceptance"] <= 1 for e in expected)
    assert {(s["task"], s["temperature"]) for s in ref["alignment"]["sampled"]} == {
        (t, T) for t in ("code", "math") for T in bench.TEMPERATURES[1:]}


def test_shipped_reference_brackets_the_best_gamma_and_shows_distillation():
    """Notebook 09's text rests on these: the best measured gamma is inside the sweep for both tasks, and the
    distilled draft is accepted more often than the undistilled control at every temperature."""
    from specdec.analysis import best_measured_gamma
    from specdec.paths import DATA_DIR

    shipped = json.loads((DATA_DIR / "bench" / "nb09_full.json").read_text())
    largest = max(shipped["config"]["gammas"])
    for task in ("code", "math"):
        assert best_measured_gamma(shipped["rows"], task, "draft") < largest
    by = {(e["task"], e["draft"], e["temperature"]): e["acceptance"] for e in shipped["alignment"]["expected"]}
    for (task, name, temperature), a in by.items():
        if name == "draft":
            assert a > by[(task, "draft_undistilled", temperature)]
