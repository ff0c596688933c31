"""Notebook 13's measurement of MTP-style and EAGLE-3-style drafting on the course's target (not a test).

The same small feature drafter trained three ways (``python -m specdec.drafters.train --only eagle3``): MTP-style
(top layer, one step ahead), fused (low, middle and top layers, one step ahead) and EAGLE-3-style (fused, with
training-time test), against notebook 12's EAGLE-1 drafter (the target's width, trained with feature regression),
all as chains of gamma 4, greedy, batch 1, interleaved with target-only decoding: tau, the conditional acceptance
at each draft position (does it fall with depth?), c, speedup, every output checked equal to target-only decoding,
and what each drafter weighs.

    python -m specdec.bench.eagle3                                            # artifacts/drafters/eagle3.json
    python -m specdec.bench.eagle3 --notebook-reference data/bench/nb13_drafters.json
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.bench import drafters
from specdec.bench.drafters import FEATURE_PROPOSERS
from specdec.paths import DATA_DIR

PROPOSERS = ("EAGLE chain", *FEATURE_PROPOSERS)


def drafter_sizes(models_dir: Path = DATA_DIR / "models") -> dict:
    """Per drafter: parameters, training objective and time, from heads_log.json."""
    log = json.loads((models_dir / "heads_log.json").read_text())
    return {name: {k: entry[k] for k in ("params", "steps", "batch_size", "train_seconds", "threads", "taps", "ttt_steps",
                                         "draft_vocab", "draft_vocab_coverage") if k in entry}
            for name, entry in log.items() if name in ("eagle", *FEATURE_PROPOSERS.values())}


def main(argv: list[str] | None = None) -> int:
    return drafters.main(argv, PROPOSERS, name="eagle3", notebook="13", description=__doc__.splitlines()[0],
                         extra=lambda: {"drafters": drafter_sizes()})


if __name__ == "__main__":
    raise SystemExit(main())
