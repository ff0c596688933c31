"""Notebook 12's self-drafters: greedy output equals target-only decoding on the shipped heads, sampling is exact
(enumerated on a tiny target with random drafters: exactness must not depend on the drafter's quality), and the
shipped heads load, are small, and fail clearly when missing."""

from __future__ import annotations

import pytest
import torch

from specdec.checks.engine import shipped_pair, target_joint_after_first, tiny_pair
from specdec.checks.stats import compare_frequencies
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.generate import eagle2_generate, eagle_generate, medusa_generate
from specdec.drafters.medusa import MedusaHeads
from specdec.drafters.train import load_eagle, load_medusa, self_distillation_text, target_labels, train_eagle, train_medusa
from specdec.engine import target_only_generate
from specdec.models import corpus, tokenizer
from specdec.params import SamplingParams
from specdec.paths import DATA_DIR


@pytest.fixture(scope="module")
def shipped():
    target, _ = shipped_pair()
    return target, load_medusa(), load_eagle()


@pytest.mark.parametrize("task", ["code", "math"])
def test_greedy_self_drafting_equals_target_only(shipped, task):
    target, medusa, eagle = shipped
    prompt = tokenizer.encode((corpus.code_prompts(2) if task == "code" else corpus.math_prompts(2))[1])
    reference = target_only_generate(target, prompt, 64)
    runs = {"medusa": medusa_generate(target, medusa, prompt, 64),
            "eagle gamma 3": eagle_generate(target, eagle, prompt, 64, gamma=3),
            "eagle gamma 6": eagle_generate(target, eagle, prompt, 64, gamma=6),
            "eagle-2": eagle2_generate(target, eagle, prompt, 64, depth=4, top_k=3, budget=10)}
    for name, run in runs.items():
        assert run.tokens == reference, f"{name} differs from target-only greedy decoding"
        assert run.tau > 1.2, f"{name}: the trained drafter should accept something (tau {run.tau:.2f})"


def _tiny_drafters(seed: int = 0):
    target, _ = tiny_pair(vocab=6, noise=0.5, seed=3)
    torch.manual_seed(seed)
    heads = MedusaHeads(target.config.d_model, target.config.vocab_size, 3)
    drafter = EagleDrafter(target.config)
    with torch.no_grad():
        for p in list(heads.parameters()) + list(drafter.parameters()):
            p.copy_(torch.randn_like(p) * 0.5)
    return target, heads.eval(), drafter.eval()


@pytest.mark.parametrize("method", ["eagle chain", "eagle-2 tree", "medusa tree"])
def test_sampling_is_exact(method):
    """Tokens 2-4 (token 1 comes from the prefill) over 1200 seeded runs follow the target's exact joint
    distribution, enumerated from the model, within 5 sigma per outcome."""
    target, heads, drafter = _tiny_drafters()
    params, prompt = SamplingParams(temperature=1.0), [1, 2]
    exact = target_joint_after_first(target, prompt, params)
    g = torch.Generator().manual_seed(0)
    run = {"eagle chain": lambda: eagle_generate(target, drafter, prompt, 4, gamma=2, params=params, generator=g),
           "eagle-2 tree": lambda: eagle2_generate(target, drafter, prompt, 4, depth=3, top_k=2, budget=5, params=params,
                                                   generator=g),
           "medusa tree": lambda: medusa_generate(target, heads, prompt, 4, [(0,), (1,), (0, 0), (0, 0, 0)], params, g)}[method]
    samples, forwards = [], 0
    for _ in range(1200):
        result = run()
        samples.append(tuple(result.tokens[1:4]))
        forwards += len(result.committed)
    compare_frequencies(samples, exact, f"{method}, tokens 2-4")
    assert forwards < 1200 * 3, "the drafter never got anything accepted: the test would not exercise acceptance"


def test_shipped_heads_are_small_and_load():
    for name in ("medusa", "eagle"):
        size = (DATA_DIR / "models" / f"{name}.safetensors").stat().st_size
        assert size < 8e6, f"{name}.safetensors is {size / 1e6:.1f} MB"
    assert load_medusa().num_heads == 4


def test_missing_heads_say_how_to_train_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="make heads"):
        load_medusa(tmp_path / "medusa.safetensors")
    with pytest.raises(FileNotFoundError, match="make heads"):
        load_eagle(tmp_path / "eagle.safetensors")


def test_training_lowers_the_losses():
    """A few steps of each recipe on a little self-generated text lower its loss (the recipe runs end to end)."""
    target, _ = tiny_pair(vocab=256, seed=2)  # byte-level, like the corpus the text starts from
    text = self_distillation_text(target, n_sequences=8, prompt_len=16, new_tokens=16, batch_size=8)
    assert text.shape == (8, 32) and int(text.max()) < 256
    logits, features = target_labels(target, text)
    _, medusa_losses = train_medusa(target, text, logits, features, steps=30, batch_size=4, num_heads=2, lr=3e-3)
    _, eagle_losses = train_eagle(target, text, logits, features, steps=30, batch_size=4, lr=3e-3)
    assert sum(medusa_losses[-5:]) < sum(medusa_losses[:5])
    assert sum(eagle_losses[-5:]) < sum(eagle_losses[:5])
