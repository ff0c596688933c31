"""Pictures and widgets the notebooks show: :mod:`~specdec.viz.plots` (rounds, caches, distributions),
:mod:`~specdec.viz.drafters` (notebook 12's Medusa tree, EAGLE shift, EAGLE-2 rerank) and
:mod:`~specdec.viz.simulator` (notebook 01's interactive speedup simulator)."""
