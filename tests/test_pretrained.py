"""Your loop on real models, tested offline: the shipped checkpoints written as Hugging Face
folders, loaded back by path through transformers' Auto classes, and driven by notebook 05's
reference loop through :mod:`specdec.models.pretrained`."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("transformers")

from specdec import engine  # noqa: E402
from specdec.bench.pretrained import read_prompts  # noqa: E402
from specdec.bench.speculative import main as bench_main  # noqa: E402
from specdec.checks.engine import _check_rounds, _check_sampling, shipped_pair  # noqa: E402
from specdec.engine import speculative_generate, target_only_generate  # noqa: E402
from specdec.models import corpus, tokenizer  # noqa: E402
from specdec.models.hf import byte_tokenizer, export_course_models, hf_generate, save_folder  # noqa: E402
from specdec.models.model import KVCache, Llama, LlamaConfig  # noqa: E402
from specdec.models.pretrained import ModelNotFoundError, PretrainedCache, PretrainedLM, load_pretrained  # noqa: E402
from specdec.params import check_vocabularies  # noqa: E402
from specdec.recording import RecordingModel, SpeculativeEngine  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return export_course_models(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def pair(folders):
    return load_pretrained(folders["target"]), load_pretrained(folders["draft"])


def test_folders_load_through_the_auto_classes(folders, pair):
    from transformers import AutoConfig, AutoTokenizer

    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in folders["target"].iterdir()}
    assert AutoConfig.from_pretrained(folders["target"]).model_type == "llama"
    text = "def f(x):\n    return x ** 2  # héllo ✓"
    hf_tokenizer = AutoTokenizer.from_pretrained(folders["target"])
    assert hf_tokenizer.encode(text, add_special_tokens=False) == tokenizer.encode(text)
    assert hf_tokenizer.decode(tokenizer.encode(text)) == text
    target, draft = pair
    assert (target.config.vocab_size, target.config.max_seq_len) == (256, 512)
    assert (target.device.type, target.dtype) == ("cpu", torch.float32)
    assert target.encode(text) == tokenizer.encode(text) and target.decode(target.encode(text)) == text
    ours, _ = shipped_pair()
    ids = torch.tensor([tokenizer.encode(corpus.code_prompts(1)[0])])
    logits = target(ids)  # (1, T, 256): float32 on the CPU whatever the model runs in; probs() makes float64
    assert logits.dtype == torch.float32 and logits.device.type == "cpu"
    assert torch.allclose(logits, ours(ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("task", ["code", "math"])
def test_reference_loop_through_the_adapter_is_target_only_greedy_and_transformers_assisted(pair, task):
    target, draft = pair
    text = (corpus.code_prompts if task == "code" else corpus.math_prompts)(1)[0]
    ids = target.encode(text)
    ours, _ = shipped_pair()
    expected = target_only_generate(ours, ids, 48)  # the course's own model, same weights
    assert target_only_generate(target, ids, 48) == expected
    t_rec, d_rec = RecordingModel(target, keep_logits=True), RecordingModel(draft)
    assert speculative_generate(t_rec, d_rec, ids, 48, 4) == expected
    _check_rounds(f"{task}, through the adapter", ids, 4, t_rec, d_rec, 48)  # every round's cache lengths
    assert hf_generate(target.model, ids, 48, assistant_model=draft.model) == expected


@pytest.mark.parametrize("name", ["target_only_generate", "speculative_generate"])
def test_sampling_through_the_adapter_passes_notebook_05s_enumeration(tmp_path, name):
    """Notebook 05's check: tokens 1-3 of seeded runs (temperature 0.8, top-k 4, top-p 0.9) against the exact joint
    of the target, enumerated with the course's model; the runs go through Hugging Face folders. 400 runs, not the
    notebook's 1500: the adapter returns the course model's logits (test_folders_load_through_the_auto_classes), so
    this only has to catch a sampling path the adapter breaks, a gross error (an outcome of probability 0, or one
    off by more than its 5-sigma band at 400 runs)."""
    def through(model: Llama) -> PretrainedLM:
        return load_pretrained(save_folder(model, tmp_path / str(id(model)), torch.float32, with_tokenizer=False))

    _check_sampling(getattr(engine, name), name, n=400, through=through)


def test_crop_rolls_back_in_place(pair):
    target, _ = pair
    ids = tokenizer.encode(corpus.code_prompts(1)[0])
    cache = KVCache(target.config)
    assert isinstance(cache, PretrainedCache) and cache.length == 0
    target(torch.tensor([ids[:40]]), cache)
    first = cache.cache.layers[0].keys
    cache.crop(30)
    assert cache.length == 30 == cache.cache.get_seq_length()
    assert cache.cache.layers[0].keys.data_ptr() == first.data_ptr()  # a view of the same storage: no copy
    resumed = target(torch.tensor([ids[30:40]]), cache)[0]
    assert torch.allclose(resumed, target(torch.tensor([ids[:40]]))[0, 30:], atol=1e-5)
    with pytest.raises(ValueError, match="cannot crop a cache of length 40 to 41"):
        cache.crop(41)
    with pytest.raises(NotImplementedError, match="tree masks"):
        target(torch.tensor([ids[:3]]), KVCache(target.config), mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="KVCache\\(model.config\\) of this model"):
        target(torch.tensor([ids[:3]]), KVCache(shipped_pair()[0].config))


def test_a_vocabulary_mismatch_names_both_sizes_and_universal_assisted_generation(tmp_path):
    torch.manual_seed(0)
    small = LlamaConfig(vocab_size=6, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=64)
    target = load_pretrained(save_folder(Llama(small), tmp_path / "t", with_tokenizer=False))
    draft = load_pretrained(save_folder(Llama(LlamaConfig(**{**small.to_dict(), "vocab_size": 8})), tmp_path / "d",
                                        with_tokenizer=False))
    for attempt in (lambda: speculative_generate(target, draft, [1, 2], 4, 2),
                    lambda: SpeculativeEngine(target, draft)):
        with pytest.raises(ValueError, match=r"draft scores 8 token ids, the target 6.*Universal Assisted Generation"):
            attempt()
    # Same size, different tokens: two ids swapped.
    ours = Llama(LlamaConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=64))
    model = load_pretrained(save_folder(ours, tmp_path / "bytes")).model
    swapped = byte_tokenizer()
    vocab = swapped.backend_tokenizer.get_vocab()
    a, b = (t for t, i in vocab.items() if i in (97, 98))
    swapped.backend_tokenizer.model = type(swapped.backend_tokenizer.model)(vocab={**vocab, a: vocab[b], b: vocab[a]},
                                                                              merges=[])
    with pytest.raises(ValueError, match="map ids to different tokens.*Universal Assisted Generation"):
        check_vocabularies(PretrainedLM(model, byte_tokenizer()), PretrainedLM(model, swapped))


def test_bench_on_local_folders(folders, capsys, tmp_path):
    out = tmp_path / "r.json"
    assert bench_main(["--threads", "1",
                       "--target", str(folders["target"]), "--draft", str(folders["draft"]), "--prompts", "math",
                       "--num-prompts", "1", "--tokens", "24", "--repeats", "2", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    methods = ("target only", "speculative (gamma 4)", "prompt lookup (gamma 4)", "hf greedy", "hf assisted (gamma 4)",
               "hf prompt lookup (gamma 4)")
    assert all(method in table for method in methods) and "c = " in table
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == set(methods) and all(r["identical"] == "1/1" for r in rows.values())
    spec = rows["speculative (gamma 4)"]
    assert 0 < spec["draft_acceptance_rate"] <= spec["alpha"] <= 1 and spec["tokens_per_round"] > 1
    assert all(r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"] for r in rows.values())
    assert "warnings" in json.loads(out.read_text())["machine"] and "interleaved repeats" in table
    # Without a draft: target-only and prompt lookup.
    assert bench_main(["--threads", "1",
                       "--target", str(folders["target"]), "--prompts", "code", "--num-prompts", "1", "--tokens",
                       "16", "--no-hf", "--json", str(out)]) == 0
    assert [r["method"] for r in json.loads(out.read_text())["rows"]] == ["target only", "prompt lookup (gamma 4)"]


def test_a_hub_name_without_network_fails_at_once(tmp_path):
    """The hub is refused (a closed local port stands in for a machine without network), the cache is empty."""
    env = {name: value for name, value in os.environ.items() if name.lower() not in ("https_proxy", "http_proxy")}
    env.update(HF_HOME=str(tmp_path), HF_ENDPOINT="http://127.0.0.1:9")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "specdec.bench.speculative", "--target", "Qwen/Qwen2.5-1.5B", "--draft",
                           "Qwen/Qwen2.5-0.5B"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and time.perf_counter() - start < 30
    assert "could not be found locally" in done.stderr and "hf download Qwen/Qwen2.5-1.5B" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_paths_and_prompt_files_get_clear_errors(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no model folder at ./missing"):
        load_pretrained("./missing")
    with pytest.raises(ModelNotFoundError, match="holds no config.json"):
        load_pretrained(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "a\\nb"}\n"c"\n')
    (tmp_path / "p.txt").write_text("one\\ntwo\n\nthree\n")
    assert read_prompts(str(tmp_path / "p.jsonl"), 5) == ["a\nb", "c"]
    assert read_prompts(str(tmp_path / "p.txt"), 1) == ["one\ntwo"]
    with pytest.raises(FileNotFoundError, match="code, math or a file"):
        read_prompts("poetry", 2)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match="bad.jsonl: expected non-empty prompts"):
        read_prompts(str(tmp_path / "bad.jsonl"), 5)
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="broken.jsonl, line 2: not JSON"):
        read_prompts(str(tmp_path / "broken.jsonl"), 5)
    for device in ("gpu", "mps"):
        with pytest.raises(SystemExit):
            bench_main(["--target", "x", "--device", device])



def test_setting_length_crops_and_recurrent_states_refuse_to_roll_back(pair):
    target, _ = pair
    cache = KVCache(target.config)
    target(torch.tensor([list(range(97, 117))]), cache)
    cache.length = 12  # how a learner may roll back the course's cache: the same crop here
    assert cache.cache.get_seq_length() == 12
    from transformers import AutoModelForCausalLM, Qwen3NextConfig

    from specdec.models.hf import quiet_transformers

    hybrid = Qwen3NextConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_value_heads=2,
                             linear_num_key_heads=1, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=2,
                             num_experts_per_tok=1, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                             layer_types=["linear_attention", "full_attention"])
    with quiet_transformers():
        model = PretrainedLM(AutoModelForCausalLM.from_config(hybrid))
        cache = KVCache(model.config)
        model(torch.tensor([[1, 2, 3, 4, 5, 6]]), cache)
    with pytest.raises(NotImplementedError, match="recurrent states"):
        cache.crop(3)  # a recurrent state cannot be cropped: refusing beats a silently wrong continuation


def test_a_draft_padded_differently_shares_the_vocabulary(folders, pair, tmp_path):
    """Same tokenizer, LM heads of 256 and 320 rows (Qwen2.5-7B against 0.5B, in small): the logits are cut
    to 256, every token is still there, and the output is the target's."""
    from specdec.models.checkpoints import load_pair
    from specdec.models.pretrained import share_vocabulary

    _, course_draft = load_pair()
    padded = Llama(LlamaConfig(**{**course_draft.config.to_dict(), "vocab_size": 320}))
    state = course_draft.state_dict()
    with torch.no_grad():
        for name in ("embed_tokens.weight", "lm_head.weight"):
            state[name] = torch.cat([state[name], torch.zeros(64, state[name].shape[1])])
    padded.load_state_dict(state)
    target, draft = load_pretrained(folders["target"]), load_pretrained(save_folder(padded, tmp_path / "padded"))
    with pytest.raises(ValueError, match="only the LM heads' padding differs.*share_vocabulary"):
        check_vocabularies(target, draft)
    assert share_vocabulary(target, draft) == 256 and draft.config.vocab_size == 256
    ids = target.encode(corpus.math_prompts(1)[0])
    assert speculative_generate(target, draft, ids, 32, 4) == target_only_generate(pair[0], ids, 32)


def test_transformers_rows_ignore_the_checkpoints_generation_defaults(folders, tmp_path):
    """A released model's generation_config may set an end-of-text token, a repetition penalty and sampling;
    transformers' generate would apply them, so the hf rows are compared on plain greedy decoding."""
    import shutil

    for name in ("target", "draft"):
        shutil.copytree(folders[name], tmp_path / name)
        path = tmp_path / name / "generation_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "eos_token_id": 10, "repetition_penalty": 1.3,
                                    "do_sample": True, "temperature": 0.7, "no_repeat_ngram_size": 3}))
    out = tmp_path / "r.json"
    assert bench_main(["--threads", "1",
                       "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--prompts", "code",
                       "--num-prompts", "1", "--tokens", "48", "--json", str(out)]) == 0
    assert all(r["identical"] == "1/1" for r in json.loads(out.read_text())["rows"])
