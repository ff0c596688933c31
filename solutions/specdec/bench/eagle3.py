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

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specdec.bench.drafters import FEATURE_PROPOSERS, measure
from specdec.paths import DATA_DIR

PROPOSERS = ("EAGLE chain", *FEATURE_PROPOSERS)


def drafter_sizes(models_dir: Path = DATA_DIR / "models") -> dict:
    """Per drafter: parameters, training objective and time, from heads_log.json."""
    log = json.loads((models_dir / "heads_log.json").read_text())
    return {name: {k: entry[k] for k in ("params", "steps", "batch_size", "train_seconds", "threads", "taps", "ttt_steps",
                                         "draft_vocab", "draft_vocab_coverage") if k in entry}
            for name, entry in log.items() if name in ("eagle", *FEATURE_PROPOSERS.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4, help="prompts per task (code, math)")
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("artifacts") / "drafters")
    parser.add_argument("--notebook-reference", type=Path, metavar="JSON", help="write here instead (notebook 13's copy)")
    args = parser.parse_args(argv)
    if min(args.prompts, args.tokens, args.repeats, args.threads) < 1:
        parser.error("--prompts, --tokens, --repeats and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    try:
        report = measure(args.prompts, args.tokens, args.repeats, proposers=PROPOSERS)
    except FileNotFoundError as error:
        print(f"bench.eagle3: {error}", file=sys.stderr)
        return 2
    report["drafters"] = drafter_sizes()
    report["measured_on"] = f"{time.strftime('%Y-%m-%d')}, {args.threads} CPU thread(s)"
    report["seconds"] = round(time.perf_counter() - start)
    path = args.notebook_reference or args.out / "eagle3.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path} in {report['seconds']} s")
    return 0 if all(r["identical"] for r in report["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
