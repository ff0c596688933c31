"""The models the course runs: the small Llama and its KV cache, the byte tokenizer, the two tasks' text,
the toy models of notebooks 02-04, checkpoints and their training, and Hugging Face on either side.

- :mod:`~specdec.models.model`: the Llama-style decoder and its KV cache (nanoGPT-sized, one file);
- :mod:`~specdec.models.tokenizer`: bytes as token ids;
- :mod:`~specdec.models.corpus`: the code and math text, made here (no downloads);
- :mod:`~specdec.models.toy`: enumerable toy "language models" for notebooks 02-04;
- :mod:`~specdec.models.checkpoints`: save and load the shipped weights;
- :mod:`~specdec.models.train`: ``python -m specdec.models.train`` trains the target and the drafts;
- :mod:`~specdec.models.cards`: the model card in ``data/models/README.md``;
- :mod:`~specdec.models.hf`: the course's checkpoints as Hugging Face ``LlamaForCausalLM`` folders;
- :mod:`~specdec.models.pretrained`: any Hugging Face causal LM behind the course's model interface;
- :mod:`~specdec.models.devices`: where a model's tensors live, timing on an asynchronous device, and whether
  Triton is installed.
"""
