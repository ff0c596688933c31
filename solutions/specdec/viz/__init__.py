"""Pictures and widgets the notebooks show: :mod:`~specdec.viz.plots` (rounds, caches, distributions) and
:mod:`~specdec.viz.simulator` (notebook 01's interactive speedup simulator)."""
