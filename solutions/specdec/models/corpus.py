"""The two tasks' text, made here and deterministic: no downloads.

- code: Python source from CPython 3.11.7's standard library, pinned as a snapshot in
  ``data/corpus/`` (the models were trained and evaluated on it), so prompts, measurements
  and tests are the same on every Python. Files are split into train and held-out by a hash
  of their name, so prompts are unseen. ``data/corpus/README.md`` says how it was made.
- math: step-by-step arithmetic word problems from the course's own generator.

``python -m specdec.models.corpus`` writes the held-out prompt sets to data/prompts/.
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
import zlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from specdec.paths import DATA_DIR

#: The pinned source: one JSON line per file, {"path", "held_out", "text"}, ASCII files only, in
#: stdlib-relative path order; training files up to the first 4,000,000 characters, every held-out file.
SNAPSHOT = DATA_DIR / "corpus" / "stdlib-3.11.7.jsonl.xz"


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the standard library's root, e.g. "json/decoder.py"
    held_out: bool
    text: str


@cache
def source_files() -> tuple[SourceFile, ...]:
    """The snapshot's files, in order (read once per process: code_prompts is called by many checks)."""
    if not SNAPSHOT.exists():
        raise FileNotFoundError(f"the code corpus snapshot is missing at {SNAPSHOT}; restore it from git")
    lines = lzma.decompress(SNAPSHOT.read_bytes()).decode("ascii").splitlines()
    return tuple(SourceFile(**json.loads(line)) for line in lines)


def is_held_out(path: str | Path) -> bool:
    """One file in ten, chosen by a hash of its name (stable across machines)."""
    return zlib.crc32(Path(path).name.encode()) % 10 == 0


def code_text(max_bytes: int, held_out: bool = False) -> str:
    """Concatenated source of the training (or held-out) files, up to max_bytes."""
    parts, size = [], 0
    for file in source_files():
        if file.held_out != held_out:
            continue
        parts.append(file.text)
        size += len(file.text)
        if size >= max_bytes:
            return "\n".join(parts)[:max_bytes]
    if not held_out:
        raise ValueError(f"the snapshot holds {size:,} characters of training code; {max_bytes:,} were asked for")
    return "\n".join(parts)


_NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jon", "Kai", "Lena", "Mia", "Noor"]
_ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "cards", "shells", "stamps", "cookies"]


def math_problem(rng: random.Random) -> str:
    """One word problem with a worked, step-by-step answer."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(4)
    a, b, c = rng.randint(2, 60), rng.randint(2, 12), rng.randint(2, 12)
    if kind == 0:
        total = a + b * c
        q = f"{name} has {a} {item}. {name} buys {b} bags with {c} {item} each. How many {item} does {name} have now?"
        steps = f"{b} * {c} = {b * c}. {a} + {b * c} = {total}."
    elif kind == 1:
        a = max(a, b + c)
        total = a - b - c
        q = f"{name} has {a} {item}. {name} gives {b} to a friend and loses {c}. How many {item} are left?"
        steps = f"{a} - {b} = {a - b}. {a - b} - {c} = {total}."
    elif kind == 2:
        total = (a + b) * c
        q = f"A box holds {a} {item} and {b} more are added. {name} has {c} such boxes. How many {item} in all?"
        steps = f"{a} + {b} = {a + b}. {a + b} * {c} = {total}."
    else:
        per = b * c
        total = per // b
        q = f"{name} shares {per} {item} equally among {b} friends. How many {item} does each friend get?"
        steps = f"{per} / {b} = {total}."
    return f"Question: {q}\nAnswer: {steps} The answer is {total}.\n\n"


def math_text(n_problems: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(math_problem(rng) for _ in range(n_problems))


def math_prompts(n: int, seed: int = 1_000_003) -> list[str]:
    """Held-out questions (a seed the training text never uses), cut before the answer."""
    rng = random.Random(seed)
    return [math_problem(rng).split("Answer:")[0] + "Answer:" for _ in range(n)]


def code_prompts(n: int, length: int = 160) -> list[str]:
    """Held-out code: the first `length` characters of functions from held-out files."""
    prompts = []
    for file in source_files():
        if not file.held_out:
            continue
        for chunk in file.text.split("\ndef ")[1:]:
            if len(chunk) > length + 100:
                prompts.append("def " + chunk[:length])
                break  # one per file, for variety
        if len(prompts) == n:
            break
    return prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the held-out prompt sets to data/prompts/.")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--out", type=Path, default=DATA_DIR / "prompts")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for task, prompts in (("math", math_prompts(args.n)), ("code", code_prompts(args.n))):
        path = args.out / f"{task}.jsonl"
        path.write_text("".join(json.dumps({"task": task, "prompt": p}) + "\n" for p in prompts))
        print(f"wrote {len(prompts)} prompts to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
