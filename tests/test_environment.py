"""One list of dependencies: pyproject.toml. environment.yml and the Makefile only install it."""

import re

import tomllib
import yaml

from specdec.paths import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
PINNED = {"torch", "triton", "nbgrader", "nbval"}
DESIGN_CARD = {"torch", "jupyterlab", "nbgrader", "matplotlib", "ipywidgets", "nbval", "triton"}


def _requirements() -> dict[str, str]:
    reqs = PYPROJECT["project"]["dependencies"] + [r for group in PYPROJECT["project"]["optional-dependencies"].values()
                                                   for r in group]
    return {re.split(r"[<>=!~\[ ]", r, 1)[0].lower(): r for r in reqs}


def test_design_card_packages_declared_and_pinned():
    reqs = _requirements()
    assert DESIGN_CARD <= set(reqs)
    for name in PINNED:
        assert "==" in reqs[name], f"{name} must be pinned: {reqs[name]}"


def test_environment_yml_installs_the_project_and_nothing_else():
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    conda = [d for d in deps if isinstance(d, str)]
    pip = [d for d in deps if isinstance(d, dict)]
    assert sorted(re.split(r"[=<>]", d)[0] for d in conda) == ["pip", "python"]
    python = next(d for d in conda if d.startswith("python"))
    minimum = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, python.split("=")[1].split("."))) >= tuple(map(int, minimum.split(".")))
    assert pip == [{"pip": [f'-e ".[{DEFAULT_EXTRAS}]"']}]


# Every extra but "ui" (Playwright, for the maintainers' browser test, which make test-ui adds).
DEFAULT_EXTRAS = ",".join(sorted(set(PYPROJECT["project"]["optional-dependencies"]) - {"ui"}))


def test_makefile_installs_the_same_extras():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f'-e ".[{DEFAULT_EXTRAS}]"' in makefile
    assert f'-e ".[{DEFAULT_EXTRAS},ui]"' in makefile  # make test-ui: the same, plus Playwright
