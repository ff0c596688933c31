"""Any Hugging Face causal LM behind the course's model interface: your loop on real models.

The engine and the learner's loops (notebook 05) need four things of a model: ``model(tokens,
cache)`` -> logits (B, T, V) for T new positions, ``KVCache(model.config)`` for an empty cache,
``cache.length`` and ``cache.crop(n)``. :class:`PretrainedLM` gives a ``transformers`` model
exactly that, so ``speculative_generate(target, draft, ...)`` runs unchanged on SmolLM2, Qwen2.5 or
Llama 3.2:

- **The cache.** ``KVCache(config)`` builds a :class:`PretrainedCache` (the config names it as its
  ``cache_class``), which holds a transformers ``DynamicCache``. ``crop(n)`` calls
  ``DynamicCache.crop(-(length - n))``: in transformers 5.23 a negative argument is the number of
  positions to remove, and each layer slices its keys and values to their first n positions (views:
  nothing is copied). The next forward's ``update`` concatenates the new positions onto them with
  ``torch.cat``, a new tensor per layer, as in every transformers decode step, speculative or not.
  No copy of the cache is made to roll back.
- **Logits** come back on the CPU in float32, whatever the model runs on, so a loop written with CPU
  tensors runs unchanged and ``SamplingParams.probs`` makes the same float64 distributions as for
  the course's models. The copy to the host is also the device synchronisation that makes a
  forward's wall time honest on a GPU.
- **Device and dtype**: CUDA when present (bfloat16, or float16 on a GPU without it), else the CPU
  in float32 (bfloat16 matrix products are slow on most CPUs).
- **Text**: :meth:`PretrainedLM.encode` and :meth:`PretrainedLM.decode` use the model's tokenizer.

:func:`load_pretrained` takes a local folder or a hub name. It never waits on a network that is
not there: a name that is neither a folder nor in the local Hugging Face cache, with the hub
unreachable, fails at once with :class:`ModelNotFoundError`, which says how to get the model.
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

import torch

from specdec.models.hf import quiet_transformers
from specdec.models.model import KVCache

DEFAULT_MAX_SEQ_LEN = 2048  # for a config that states no context length


class ModelNotFoundError(FileNotFoundError):
    """The model is neither a local folder nor in the local Hugging Face cache, and cannot be downloaded."""


class PretrainedCache(KVCache):
    """A transformers ``DynamicCache`` with the course cache's ``length`` and ``crop``; batch 1 or more, one
    length for every row. Setting ``length`` lower crops, as on the course's cache."""

    def __init__(self, config: "PretrainedConfig", batch_size: int = 1, max_len: int | None = None,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        from transformers import DynamicCache

        # dtype and device follow the model (transformers allocates on the first forward).
        self.max_len = max_len or config.max_seq_len
        self.cache = DynamicCache(config=config.hf_config)
        # Sliding-window layers keep only their window unless they record their past until the next crop;
        # plain attention layers keep everything anyway.
        self.cache.activate_past_recording()
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        if value < self._length:
            self._roll_back(value)
        self._length = value

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        raise TypeError("a PretrainedCache is written by the transformers model it belongs to, not layer by layer")

    def crop(self, length: int) -> None:
        """Roll back to the first ``length`` positions (DynamicCache.crop with the number to remove)."""
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot crop a cache of length {self._length} to {length}")
        self._roll_back(length)
        self._length = length

    def _roll_back(self, length: int) -> None:
        removed = self._length - length
        if removed and not self.cache.is_croppable:
            raise NotImplementedError(
                "this model's cache holds recurrent states (linear attention or a state-space layer) that transformers "
                "cannot roll back: speculative decoding on it needs a snapshot of those states per draft position")
        self.cache.crop(-removed)  # even when removed == 0: sliding-window layers trim back to their window


@dataclass(frozen=True)
class PretrainedConfig:
    """What the engine reads of a config, for a transformers model (the course's LlamaConfig has the same names)."""

    vocab_size: int  # the logits' width (the LM head's rows; may exceed the tokenizer's size)
    max_seq_len: int
    hf_config: Any  # the transformers PretrainedConfig
    vocab_fingerprint: str | None = None  # sha1 of the tokenizer's id -> token map (params.check_vocabularies)
    cache_class: ClassVar[type] = PretrainedCache  # what KVCache(config) builds


class PretrainedLM:
    """A transformers causal LM called the way the engine calls the course's Llama.

    ``model(tokens (B, T), cache)`` -> logits (B, T, V), float32 on the CPU; with a cache the tokens
    continue what it holds. Tree masks, explicit positions and hidden-state features are the course
    model's alone: the adapter runs the chain loops (notebook 05's loop, prompt lookup)."""

    logits_device = torch.device("cpu")  # where the logits come back, whatever the model runs on (models.devices)

    def __init__(self, model, tokenizer=None, name: str = "") -> None:
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name or model.config.name_or_path
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        hf_config = model.config
        max_len = getattr(hf_config, "max_position_embeddings", None) or DEFAULT_MAX_SEQ_LEN
        self.config = PretrainedConfig(model.get_output_embeddings().weight.shape[0], int(max_len), hf_config,
                                       _fingerprint(tokenizer))

    def eval(self) -> PretrainedLM:
        return self

    def parameters(self):
        return self.model.parameters()

    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @torch.inference_mode()
    def __call__(self, tokens: torch.Tensor, cache: KVCache | None = None, position_ids: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, return_hidden: bool = False) -> torch.Tensor:
        if position_ids is not None or mask is not None or return_hidden:
            raise NotImplementedError(
                "a Hugging Face model through specdec.models.pretrained takes tokens and a cache only: tree masks, explicit "
                "positions and hidden-state features belong to the course's Llama (notebooks 07 and 12)")
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be a (B, T) tensor of token ids, got {tuple(tokens.shape)} {tokens.dtype}")
        if cache is None:
            out = self.model(input_ids=tokens.to(self.device), use_cache=False)
            return self._logits(out)
        if not isinstance(cache, PretrainedCache):
            raise TypeError(f"{self.name}: the cache must come from KVCache(model.config) of this model, got "
                            f"{type(cache).__name__}")
        held = cache.cache.get_seq_length()
        if held != cache.length:
            raise ValueError(f"{self.name}: this cache holds {held} positions but says {cache.length}: was it made "
                             "for another model, or written outside the adapter?")
        end = cache.length + tokens.shape[1]
        if end > min(cache.max_len, self.config.max_seq_len):
            raise ValueError(f"{self.name}: {cache.length} cached + {tokens.shape[1]} new positions exceed the "
                             f"context of {min(cache.max_len, self.config.max_seq_len)}")
        out = self.model(input_ids=tokens.to(self.device), past_key_values=cache.cache, use_cache=True)
        cache.advance(tokens.shape[1])
        return self._logits(out)

    def _logits(self, out) -> torch.Tensor:
        """(B, T, V) float32 on the host; the copy waits for the device."""
        logits = out.logits
        if self.config.vocab_size < logits.shape[-1]:
            logits = logits[..., : self.config.vocab_size]
        return logits.cpu().float()

    def encode(self, text: str) -> list[int]:
        """Text -> token ids as the tokenizer gives them to ``generate`` (with a beginning-of-text token where the
        model's tokenizer adds one, as Llama 3's does; the course's bytes have none)."""
        if self.tokenizer is None:
            raise ValueError(f"{self.name} has no tokenizer: pass token ids")
        return self.tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            raise ValueError(f"{self.name} has no tokenizer")
        return self.tokenizer.decode(ids)


def share_vocabulary(target: PretrainedLM, draft: PretrainedLM) -> int | None:
    """Cut both models' logits to their common width when they share a tokenizer and differ only in padding.

    Checkpoints pad the LM head for faster matrix products (Qwen2.5-7B has 152,064 rows, 0.5B-3B 151,936, for a
    tokenizer of about 151,665 tokens). The rows past the tokenizer are no token at all, so both models' logits
    are cut to the smaller width, which still covers every token. Returns the new width, or None if nothing was
    cut (the same width, or not the same tokenizer: params.check_vocabularies then explains)."""
    widths = target.config.vocab_size, draft.config.vocab_size
    same = target.config.vocab_fingerprint is not None and target.config.vocab_fingerprint == draft.config.vocab_fingerprint
    if widths[0] == widths[1] or not same or min(widths) < len(target.tokenizer):
        return None
    for model in (target, draft):
        model.config = replace(model.config, vocab_size=min(widths))
    return min(widths)


def _fingerprint(tokenizer) -> str | None:
    if tokenizer is None:
        return None
    pairs = sorted((i, t) for t, i in tokenizer.get_vocab().items())
    return hashlib.sha1("\n".join(f"{i}\t{t}" for i, t in pairs).encode()).hexdigest()


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on a GPU that has it (float16 otherwise); float32 on a CPU."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return torch.float32


def _looks_like_path(name: str) -> bool:
    """Hub names are ``model`` or ``owner/model``."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _hub_reachable(timeout: float = 3.0) -> bool:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlparse(proxy or constants.ENDPOINT)  # behind a proxy, the proxy is what must answer
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def locate(name_or_path: str) -> tuple[str, bool]:
    """(what to pass to from_pretrained, whether it is available locally).

    A folder is used as it is; a hub name (``owner/model``) is looked up in the local Hugging Face
    cache, else downloaded if the hub answers within seconds; otherwise :class:`ModelNotFoundError`."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a folder but holds no config.json: not a Hugging Face model folder "
                                     "(make hf-models writes the course's own)")
        return str(path), True
    if _looks_like_path(name_or_path):
        raise ModelNotFoundError(f"no model folder at {name_or_path} (for a hub model pass its name, like "
                                 "HuggingFaceTB/SmolLM2-360M; make hf-models writes the course's own folders)")
    from transformers.utils import cached_file

    try:
        if cached_file(name_or_path, "config.json", local_files_only=True, _raise_exceptions_for_missing_entries=False):
            return name_or_path, True
    except OSError:
        pass
    if _hub_reachable():
        return name_or_path, False
    raise ModelNotFoundError(
        f"{name_or_path!r} could not be found locally (not a folder here, not in the Hugging Face cache) and the hub "
        "cannot be reached from this machine. Get it where there is network, then point at the folder:\n"
        f"  hf download {name_or_path} --local-dir models/{name_or_path.split('/')[-1]}\n"
        f"  python -m specdec.bench --target models/{name_or_path.split('/')[-1]} ...\n"
        "(or download it into the cache with the same command without --local-dir, then pass the name; gated models "
        "such as meta-llama/* also need `hf auth login` and an accepted licence)")


def load_pretrained(name_or_path: str, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None) -> PretrainedLM:
    """A local folder or hub name -> :class:`PretrainedLM` (model and tokenizer) on ``device`` in ``dtype``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, local = locate(str(name_or_path))
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or default_dtype(device)
    with quiet_transformers():  # no "Loading weights" bars or generation-flag notes on stderr
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, local_files_only=local).to(device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=local)
        except (OSError, ValueError):  # a folder of weights without a tokenizer: token ids only
            tokenizer = None
    return PretrainedLM(model, tokenizer, str(name_or_path))
