"""Notebook cells that assert token equality run in float32 on any device: bfloat16 on a GPU does not promise it
(a verify forward and a decode step reduce in different orders, and a near-tie flips)."""

from __future__ import annotations

import json
import re

from conftest import SLUGS, source_path


def test_every_cell_that_loads_a_pretrained_model_and_asserts_equality_asks_for_float32():
    checked = 0
    for slug in SLUGS:
        for cell in json.loads(source_path(slug).read_text())["cells"]:
            code = "".join(cell["source"])
            if cell["cell_type"] != "code" or "load_pretrained(" not in code or not re.search(r"^assert .*==", code, re.M):
                continue
            checked += 1
            calls = re.findall(r"load_pretrained\(([^()]*(?:\([^()]*\)[^()]*)*)\)", code)
            assert calls and all("dtype=torch.float32" in args for args in calls), (slug, calls)
    assert checked >= 1  # notebook 05's comparison with transformers' assisted generation
