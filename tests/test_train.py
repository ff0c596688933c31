"""A short training run learns, and checkpoints round-trip."""

import pytest
import torch

from specdec.models import corpus, tokenizer
from specdec.models.checkpoints import load, save
from specdec.models.model import Llama, LlamaConfig
from specdec.models.train import train

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
    files = corpus.stdlib_files()
    assert files and any(corpus.is_held_out(f) for f in files) and not all(corpus.is_held_out(f) for f in files)


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
