"""The course's checkpoints inside Hugging Face transformers: the outside check.

``to_transformers(model)`` builds a ``LlamaForCausalLM`` with the same weights (our
parameter names are Hugging Face's, under ``model.``), so logits and greedy tokens can be
compared with an implementation nobody here wrote, and the benchmark can run
transformers' own assisted generation and prompt lookup on the same checkpoints.

``python -m specdec.models.hf`` (``make hf-models``) writes the shipped checkpoints as Hugging Face
model folders (config.json, model.safetensors, and a byte-level tokenizer that
``AutoTokenizer`` loads), so the loading code for real models (:mod:`specdec.models.pretrained`) is
exercised offline on what the course ships. transformers is optional:
``pip install -e ".[hf]"`` (the test extra includes it).
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specdec.models.model import Llama
from specdec.paths import DATA_DIR

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM


def _transformers():
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "the Hugging Face check needs transformers: pip install -e \".[hf]\" (or transformers==5.23.0)"
        ) from error
    return transformers


def to_transformers(model: Llama, attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    """A transformers LlamaForCausalLM holding exactly ``model``'s weights (float32, eval mode)."""
    c = model.config
    if getattr(c, "n_experts", 0):
        raise ValueError("to_transformers converts dense models only: this one is a mixture of experts")
    transformers = _transformers()
    config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,  # bytes: no special tokens
    )
    config._attn_implementation = attn_implementation
    hf = transformers.LlamaForCausalLM(config)
    state = {name if name.startswith("lm_head.") else f"model.{name}": tensor
             for name, tensor in model.state_dict().items()}
    hf.load_state_dict(state, strict=True)
    return hf.float().eval()


@torch.no_grad()
def hf_generate(hf: LlamaForCausalLM, prompt: list[int], n_tokens: int, **kwargs) -> list[int]:
    """Greedy generation of exactly n_tokens new tokens with transformers (batch 1): plain argmax decoding,
    like the course's loops. Nothing comes from the checkpoint's generation_config (a released model may set
    an end-of-text token, a repetition penalty or sampling defaults there, which ``generate`` would apply).

    Extra keyword arguments go to ``generate``: ``assistant_model=`` for assisted
    generation, ``prompt_lookup_num_tokens=`` for prompt lookup.
    """
    from transformers import GenerationConfig

    ids = torch.tensor([prompt], device=hf.device)
    saved, hf.generation_config = hf.generation_config, GenerationConfig()  # generate fills gaps from the model's
    try:
        with quiet_transformers():  # assisted generation warns about its own internal call of generate
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_tokens,
                              min_new_tokens=n_tokens, do_sample=False, pad_token_id=0, **kwargs)
    finally:
        hf.generation_config = saved
    return out[0, len(prompt):].tolist()


@contextmanager
def quiet_transformers():
    """transformers' warnings and progress bars off (they go to stderr, which a graded cell must keep empty)."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _byte_to_char() -> dict[int, str]:
    """The byte-level BPE alphabet: each byte as one printable character (bytes that print stay themselves,
    the others take the code points from 256 up, in order); what the tokenizers library's ByteLevel steps use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}


def byte_tokenizer(max_len: int = 512):
    """The course's tokenizer (token id = UTF-8 byte) as a transformers fast tokenizer: byte-level BPE with the
    256 bytes as its vocabulary and no merges, no special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: b for b, char in _byte_to_char().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=max_len, clean_up_tokenization_spaces=False)


def save_folder(model: Llama, folder: Path | str, dtype: torch.dtype = torch.bfloat16, with_tokenizer: bool = True) -> Path:
    """``model`` as a Hugging Face model folder that ``from_pretrained`` loads by path (bfloat16: the shipped
    checkpoints' own precision, so nothing is rounded)."""
    folder = Path(folder)
    with quiet_transformers():
        to_transformers(model).to(dtype).save_pretrained(folder)
        if with_tokenizer:
            byte_tokenizer(model.config.max_seq_len).save_pretrained(folder)
    return folder


def export_course_models(out: Path | str, models: Path | str = DATA_DIR / "models") -> dict[str, Path]:
    """data/models' target and draft as Hugging Face folders out/target and out/draft."""
    from specdec.models.checkpoints import load_pair

    target, draft = load_pair(models)
    return {name: save_folder(model, Path(out) / name) for name, model in (("target", target), ("draft", draft))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the shipped checkpoints as Hugging Face model folders.")
    parser.add_argument("--models", type=Path, default=DATA_DIR / "models", help="folder with target/draft.safetensors")
    parser.add_argument("--out", type=Path, default=Path("artifacts") / "hf", help="where the folders go")
    args = parser.parse_args(argv)
    _transformers()
    for name, folder in export_course_models(args.out, args.models).items():
        size = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
        print(f"{name}: {folder}/ ({size:.1f} MiB)")
    print(f"try: python -m specdec.bench --target {args.out}/target --draft {args.out}/draft --prompts code")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
