"""The two tasks' text, made here and deterministic: no downloads.

- code: Python source from this interpreter's standard library, in a fixed order. Files
  are split into train and held-out by a hash of their path, so prompts are unseen.
- math: step-by-step arithmetic word problems from the course's own generator.

``python -m specdec.models.corpus`` writes the held-out prompt sets to data/prompts/.
"""

from __future__ import annotations

import argparse
import json
import random
import sysconfig
import zlib
from functools import cache
from pathlib import Path

from specdec.paths import DATA_DIR

_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "ensurepip", "__pycache__"}


def stdlib_files() -> list[Path]:
    """The standard library's .py files, sorted by path relative to the stdlib root."""
    return list(_stdlib_files())


@cache
def _stdlib_files() -> tuple[Path, ...]:  # walked once per process: code_prompts is called by many checks
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not _SKIP_DIRS & set(p.relative_to(root).parts)]
    return tuple(sorted(files, key=lambda p: p.relative_to(root).as_posix()))


def is_held_out(path: Path) -> bool:
    """One file in ten, chosen by a hash of its name (stable across machines)."""
    return zlib.crc32(path.name.encode()) % 10 == 0


def code_text(max_bytes: int, held_out: bool = False) -> str:
    """Concatenated standard-library source (ASCII files only), up to max_bytes."""
    parts, size = [], 0
    for path in stdlib_files():
        if is_held_out(path) != held_out:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.isascii():
            continue
        parts.append(text)
        size += len(text)
        if size >= max_bytes:
            break
    return "\n".join(parts)[:max_bytes]


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
    for path in stdlib_files():
        if not is_held_out(path):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.isascii():
            continue
        for chunk in text.split("\ndef ")[1:]:
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
