"""The benchmark CLI runs end to end on tiny checkpoints and refuses bad input clearly."""

import json

import pytest

from specdec.bench import main
from specdec.model import Llama, LlamaConfig
from specdec.train import save


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
    assert {(r["task"], r["proposer"], r["gamma"]) for r in rows} == {(t, p, g) for t in ("code", "math") for p in ("draft", "lookup") for g in (1, 3)} | {(t, "tree", 4) for t in ("code", "math")}
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
