"""Where the course's files live (the repository checkout this package sits in)."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root: ``solutions/specdec/paths.py`` -> two levels up from the package.
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Data the course reads (tables, prompts, checkpoints). Override with SPECDEC_DATA.
DATA_DIR = Path(os.environ.get("SPECDEC_DATA", REPO_ROOT / "data"))

#: The nbgrader course root and the instructor notebooks.
GRADER_DIR = REPO_ROOT / "grader"
SOURCE_DIR = GRADER_DIR / "source"

#: The committed student notebooks.
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
