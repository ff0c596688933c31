"""``make check-pins``: do the project's pins resolve, from the registry, on every platform the README promises?

This machine installs a local CPU build of torch that declares no dependencies, so a pin that contradicts what
torch's published wheels require (torch 2.13.0's Linux wheels require ``triton==3.7.1``) passes here and fails on
every learner's Linux box; a requirement with no wheel for macOS (triton publishes Linux wheels only) fails on
every Mac. pip cannot tell: with ``--platform`` it still evaluates environment markers against the machine it runs
on. uv resolves for a named platform, markers included, from the packages' own metadata on the registry, so this
resolves ``pyproject.toml`` (the default extras) once per platform and Python version, and fails with uv's
explanation when any of them has no solution.

    python tests/pins.py [--pyproject PATH] [--python 3.10 3.11 ...]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Platform:
    name: str
    uv_platform: str  # uv pip compile --python-platform
    environment: dict[str, str]  # extra variables (the oldest macOS the wheels must support)
    has_triton: bool  # triton publishes wheels here


#: What the README promises: Linux on x86_64 and ARM (a GPU or not; Windows through WSL is this Linux), and a Mac
#: with Apple silicon on macOS 14 or newer (torch 2.13.0's macOS wheels are macosx_14_0_arm64; none for Intel Macs).
PLATFORMS = (
    Platform("Linux x86_64", "x86_64-manylinux_2_28", {}, True),
    Platform("Linux aarch64", "aarch64-manylinux_2_28", {}, True),
    Platform("macOS 14 arm64", "aarch64-apple-darwin", {"MACOSX_DEPLOYMENT_TARGET": "14.0"}, False),
)
PYTHONS = ("3.11", "3.12", "3.13")
WATCHED = ("torch", "triton")  # the two whose versions must agree


def default_extras(pyproject: Path) -> list[str]:
    """The extras ``make setup`` installs: every one but those the maintainers' own targets add."""
    extras = tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {})
    return sorted(set(extras) - {"ui", "pins"})


def pinned_versions(lock: str) -> dict[str, str]:
    """``{name: version}`` of the watched packages in ``uv pip compile``'s output."""
    found = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", lock, flags=re.MULTILINE)
    return {name.lower(): version for name, version in found if name.lower() in WATCHED}


def resolve(pyproject: Path, platform: Platform, python: str, uv: str) -> tuple[bool, str]:
    """(resolved, uv's lock or its explanation) for one platform and Python version."""
    with tempfile.TemporaryDirectory() as scratch:
        # a copy of pyproject.toml alone, so the project's own source tree is never built or read
        project = Path(scratch) / "pyproject.toml"
        shutil.copyfile(pyproject, project)
        command = [uv, "pip", "compile", str(project), "--python-platform", platform.uv_platform,
                   "--python-version", python, "--no-header", "--no-annotate", "--quiet", "--no-config"]
        for extra in default_extras(pyproject):
            command += ["--extra", extra]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                              env={**os.environ, **platform.environment})
    return done.returncode == 0, (done.stdout if done.returncode == 0 else done.stderr).strip()


def verdict(platform: Platform, versions: dict[str, str]) -> str | None:
    """What is wrong with a resolution that succeeded, or None."""
    if "torch" not in versions:
        return "no torch in the resolution"
    if platform.has_triton and "triton" not in versions:
        return "no triton on a platform that has its wheels: notebook 08 would not run"
    if not platform.has_triton and "triton" in versions:
        return f"triton {versions['triton']} on a platform it publishes no wheel for"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyproject", type=Path, default=REPO_ROOT / "pyproject.toml")
    parser.add_argument("--python", nargs="+", default=list(PYTHONS), help="Python versions (default: %(default)s)")
    parser.add_argument("--uv", default=shutil.which("uv", path=os.path.dirname(sys.executable)) or "uv")
    args = parser.parse_args(argv)
    failures = 0
    print(f"{args.pyproject} (extras {', '.join(default_extras(args.pyproject))}), resolved from the registry by uv:")
    for platform in PLATFORMS:
        for python in args.python:
            ok, text = resolve(args.pyproject, platform, python, args.uv)
            versions = pinned_versions(text) if ok else {}
            problem = None if not ok else verdict(platform, versions)
            label = f"  {platform.name:<15} Python {python:<5}"
            if ok and problem is None:
                print(f"{label} ok: " + ", ".join(f"{n} {versions.get(n, '(none)')}" for n in WATCHED))
                continue
            failures += 1
            print(f"{label} FAILS: {problem or 'no solution'}")
            if not ok:
                print("\n".join("      " + line for line in text.splitlines()))
    print("pins are consistent" if not failures else f"{failures} platform(s) cannot install these pins")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
