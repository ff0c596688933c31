"""A short training run learns, and checkpoints round-trip."""

import json

import pytest
import torch

from specdec.models import corpus, tokenizer
from specdec.models.checkpoints import load, save
from specdec.models.model import Llama, LlamaConfig
from specdec.models.train import train
from specdec.paths import DATA_DIR, REPO_ROOT

TINY = LlamaConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=64)


def test_tokenizer_round_trip():
    text = "def f(x):\n    return x  # ünïcode"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    with pytest.raises(ValueError, match="token ids must lie"):
        tokenizer.decode([300])


def test_corpus_is_deterministic_and_split():
    assert corpus.math_text(5, seed=3) == corpus.math_text(5, seed=3)
    assert "The answer is" in corpus.math_text(1)
    prompts = corpus.math_prompts(3)
    assert all(p.endswith("Answer:") for p in prompts)


def test_code_corpus_is_the_pinned_snapshot():
    """The code text comes from data/corpus/, never from the running interpreter: its files are in path
    order, ASCII, held out by the name hash, and the training text is cut where the models' text was."""
    files = corpus.source_files()
    assert [f.path for f in files] == sorted(f.path for f in files)
    assert all(f.text.isascii() and f.held_out == corpus.is_held_out(f.path) for f in files)
    assert sum(f.held_out for f in files) == 84 and len(files) == 360
    assert len(corpus.code_text(4_000_000)) == 4_000_000
    assert corpus.code_text(400_000) == corpus.code_text(4_000_000)[:400_000]
    with pytest.raises(ValueError, match="training code"):
        corpus.code_text(5_000_000)
    first = json.loads((DATA_DIR / "prompts" / "code.jsonl").read_text().splitlines()[0])["prompt"]
    assert corpus.code_prompts(1) == [first] and first.startswith("def run(main, *, debug=None):")


#: Modules that may ask sysconfig for a path that is not the library: make gpu-check looks for Python.h (Triton's
#: compiled path builds a small C module against it).
SYSCONFIG_FOR_HEADERS = {"bench/gpu_check.py"}


def test_no_module_reads_the_interpreters_library():
    package = REPO_ROOT / "solutions" / "specdec"
    for path in package.rglob("*.py"):
        source = path.read_text()
        assert "stdlib_files" not in source, f"{path} reads the interpreter's library"
        if path.relative_to(package).as_posix() in SYSCONFIG_FOR_HEADERS:
            assert '["stdlib"]' not in source and '["purelib"]' not in source and '["platstdlib"]' not in source
        else:
            assert "sysconfig" not in source, f"{path} reads the interpreter's library"


def test_short_training_run_learns_and_saves(tmp_path):
    data = {"math": torch.tensor(tokenizer.encode(corpus.math_text(300)), dtype=torch.long)}
    model, losses = train(TINY, data, steps=40, batch_size=8, seq_len=48, progress=False)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    save(model, tmp_path / "tiny.safetensors")
    again = load(tmp_path / "tiny.safetensors")
    x = torch.randint(0, 256, (1, 20))
    with torch.no_grad():
        assert torch.allclose(model(x), again(x), atol=0.05)  # bf16 storage
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load(tmp_path / "missing.safetensors")


def test_distillation_moves_the_student_towards_the_teacher():
    """With a teacher the loss is the soft cross-entropy; it falls, and the student's
    distributions end much closer (in KL) to the teacher's than where they started."""
    data = {"math": torch.tensor(tokenizer.encode(corpus.math_text(300)), dtype=torch.long)}
    teacher, _ = train(TINY, data, steps=40, batch_size=8, seq_len=48, progress=False)
    student_config = LlamaConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=64)
    torch.manual_seed(1)
    untrained = Llama(student_config)  # train(seed=1) starts from exactly these weights
    student, losses = train(student_config, data, steps=40, batch_size=8, seq_len=48, progress=False, teacher=teacher,
                            seed=1)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    x = data["math"][:48].view(1, -1)

    def kl(model):
        with torch.no_grad():
            p, log_q = torch.softmax(teacher(x), -1), torch.log_softmax(model(x), -1)
            return float((p * (p.clamp_min(1e-12).log() - log_q)).sum(-1).mean())

    assert kl(student) < 0.5 * kl(untrained)
