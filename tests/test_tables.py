"""The data tables load, and a broken table is reported by file and entry."""

import json

import pytest

from specdec.tables import load_gpus, load_models


def test_tables_load():
    assert {"llama-2-7b", "llama-3-8b", "llama-3-70b"} <= set(load_models())
    assert {"H100 SXM", "H200", "A100 80GB", "L4", "RTX 4090"} <= set(load_gpus())
    assert load_gpus()["H200"].bandwidth == 4.8e12


def test_bad_tables_are_named(tmp_path):
    broken = tmp_path / "models.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="models.json is not valid JSON"):
        load_models(broken)
    broken.write_text(json.dumps({"models": [{"name": "x", "vocab_size": 10, "colour": "red"}]}))
    with pytest.raises(ValueError, match=r"entry 'x' has unknown keys \['colour'\]"):
        load_models(broken)
    with pytest.raises(FileNotFoundError, match="course data file missing"):
        load_gpus(tmp_path / "absent.json")
