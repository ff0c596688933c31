"""Benchmarks: measurements, never tests. Each module is an entry point (``python -m specdec.bench.NAME``).

- ``python -m specdec.bench`` (:mod:`~specdec.bench.speculative`): the engine per task, proposer and gamma
  (notebook 09); with ``--target``/``--draft``, any Hugging Face pair (:mod:`~specdec.bench.pretrained`);
- :mod:`~specdec.bench.serve`: the serving engine under load (notebook 11);
- :mod:`~specdec.bench.drafters`: every proposer side by side (notebook 12);
- :mod:`~specdec.bench.verify`: batched verification against a per-position loop;
- :mod:`~specdec.bench.kernels`: the Triton verifier on a GPU;
- :mod:`~specdec.bench.cells`: every graded test cell's time;
- :mod:`~specdec.bench.cohort`: cohort grading throughput.
"""
