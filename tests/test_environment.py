"""One list of dependencies: pyproject.toml. environment.yml and the Makefile only install it."""

import json
import re
import subprocess
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


# Every extra but "ui" (Playwright, for the maintainers' browser test, which make test-ui adds), "pins" (uv, which
# make check-pins adds) and "hub" (JupyterHub, which make test-hub adds).
DEFAULT_EXTRAS = ",".join(sorted(set(PYPROJECT["project"]["optional-dependencies"]) - {"ui", "pins", "hub"}))


def test_makefile_installs_the_same_extras():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f'-e ".[{DEFAULT_EXTRAS}]"' in makefile
    assert f'-e ".[{DEFAULT_EXTRAS},ui]"' in makefile  # make test-ui: the same, plus Playwright
    assert f'-e ".[{DEFAULT_EXTRAS},hub]"' in makefile  # make test-hub: the same, plus JupyterHub


#: torch's own requirement on triton, as its wheels on the registry declare it (read with `make check-pins` and
#: `pip install --dry-run --no-deps --report` for manylinux_2_28_x86_64, 2026-12-07). Bumping torch means reading it
#: again: this record then no longer names the pinned version, and the test below says so.
TORCH_REQUIRES_TRITON = {"2.13.0": 'triton==3.7.1; platform_system == "Linux" and python_version < "3.15"'}
LINUX = {"platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64", "python_version": "3.11"}
MACOS = {"platform_system": "Darwin", "sys_platform": "darwin", "platform_machine": "arm64", "python_version": "3.11"}


def test_triton_is_pinned_to_what_the_pinned_torch_requires_and_only_where_it_has_wheels():
    from packaging.requirements import Requirement

    reqs = _requirements()
    torch_version = Requirement(reqs["torch"]).specifier
    pinned = next(iter(torch_version)).version
    assert pinned in TORCH_REQUIRES_TRITON, (
        f"torch {pinned}: record its triton requirement in TORCH_REQUIRES_TRITON (make check-pins shows it)")
    theirs, ours = Requirement(TORCH_REQUIRES_TRITON[pinned]), Requirement(reqs["triton"])
    triton_version = next(iter(ours.specifier)).version
    assert theirs.specifier.contains(triton_version), f"torch {pinned} requires {theirs}, the project pins {ours}"
    assert ours.marker is not None and not ours.marker.evaluate(MACOS), (
        f"triton publishes no macOS wheel: {ours} needs a Linux-only marker")
    assert theirs.marker.evaluate(LINUX) and ours.marker.evaluate(LINUX)


DEVCONTAINER = REPO_ROOT / ".devcontainer"


def test_the_container_installs_the_cpu_build_with_triton_and_opens_the_lab():
    dockerfile = (DEVCONTAINER / "Dockerfile").read_text()
    python = re.search(r"^FROM python:(\d+)\.(\d+)", dockerfile, re.M)
    minimum = PYPROJECT["project"]["requires-python"].split(">=")[1].split()[0]
    assert python and tuple(map(int, python.groups())) >= tuple(map(int, minimum.split(".")))
    assert "make .venv/.installed TORCH=cpu" in dockerfile
    assert 'CMD ["make", "lab", "HOST=0.0.0.0", "BROWSER=no"]' in dockerfile
    ignored = (DEVCONTAINER / "Dockerfile.dockerignore").read_text().split()
    assert ".venv/" in ignored  # the host's environment never lands in the image
    config = json.loads((DEVCONTAINER / "devcontainer.json").read_text())
    assert config["build"] == {"dockerfile": "Dockerfile", "context": ".."}
    assert "TORCH=cpu" in config["postCreateCommand"]


def test_torch_cpu_installs_the_pinned_torch_from_pytorchs_cpu_index_first(tmp_path):
    pin = next(r for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch=="))
    dry = subprocess.run(["make", "-n", "setup", "TORCH=cpu", f"VENV={tmp_path / 'venv'}"], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    installs = [line for line in dry if "pip install" in line]
    assert f'--index-url https://download.pytorch.org/whl/cpu "{pin}"' in installs[0] and '-e ".[' in installs[1]
    default = subprocess.run(["make", "-n", "setup", f"VENV={tmp_path / 'venv'}"], cwd=REPO_ROOT,
                             capture_output=True, text=True, check=True).stdout
    assert "download.pytorch.org" not in default
    wrong = subprocess.run(["make", "setup", "TORCH=cuda", f"VENV={tmp_path / 'venv'}"], cwd=REPO_ROOT,
                           capture_output=True, text=True)
    assert wrong.returncode != 0 and "use TORCH=cpu" in wrong.stdout and not (tmp_path / "venv").exists()


def test_the_cluster_image_installs_what_setup_installs_and_no_cohort_data():
    """Issue 52: the grading image installed other extras than `make setup` and copied the host's .git, .venv,
    submissions and gradebook into the image."""
    cluster = REPO_ROOT / "grader" / "cluster"
    setup = re.search(r'pip install [^\n]*-e "(\.\[[^\]]*\])"', (REPO_ROOT / "Makefile").read_text()).group(1)
    assert f'-e "{setup}"' in (cluster / "Dockerfile").read_text()
    ignored = (cluster / "Dockerfile.dockerignore").read_text().split()
    for kept_out in (".git", ".venv", "grader/submitted", "grader/gradebook.db", "grader/autograded", "cohort-grades"):
        assert kept_out in ignored, kept_out
    assert "grader/grades.csv" in (REPO_ROOT / ".gitignore").read_text().split()


def test_make_grade_cohort_passes_the_limits_and_filters_through():
    dry = subprocess.run(["make", "-n", "grade-cohort", "SUBMITTED=s", "TIMEOUT=90", "CELL_TIMEOUT=30", "MEMORY_MB=2048",
                          "ASSIGNMENT=01_cost_ledger", "STUDENT=alice bob"], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=True).stdout
    for option in ("--timeout 90", "--cell-timeout 30", "--memory-mb 2048", "--assignment 01_cost_ledger",
                   "--student alice", "--student bob"):
        assert option in dry, (option, dry)
