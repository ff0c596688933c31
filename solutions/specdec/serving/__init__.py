"""Speculative decoding inside a continuous-batching engine (notebook 11).

- :mod:`~specdec.serving.blocks`: the block manager (lookahead slots, freeing, the slot mapping);
- :mod:`~specdec.serving.paged`: the model runner, one forward over a ragged batch with paged KV;
- :mod:`~specdec.serving.scheduler`: one step's schedule under a token budget, with preemption;
- :mod:`~specdec.serving.commit`: ragged acceptance and stops inside accepted drafts;
- :mod:`~specdec.serving.adaptive`: gamma from measured acceptance and step costs (0 = off);
- :mod:`~specdec.serving.engine`: :class:`ServingEngine`, which ties them together;
- :mod:`~specdec.serving.numerics`: decode against verify logits, bit for bit (lossless is not bitwise).
"""
