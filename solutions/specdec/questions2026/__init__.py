"""Notebook 15, the questions of 2026: drafting a block in one pass (:mod:`.parallel`), targets that carry a
recurrent state (:mod:`.hybrid`), and a drafter across its target's life (:mod:`.drift`); :mod:`.ledger` prices
them, :mod:`.train` makes their models. Lessons only: nothing here imports checks, mistakes, course or bench."""
