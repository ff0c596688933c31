"""A sandbox per submission for cohort grading, on bubblewrap (Debian's ``bubblewrap``).

A learner's kernel runs as an unprivileged uid (nobody), in its own PID, IPC, UTS, network and cgroup namespaces and a
mount namespace that holds only: the system's ``/usr`` and ``/etc``, the Python and virtual environment the course
runs on, the course's ``data/``, a *graded build* of the package (:func:`graded_build`), a private ``/tmp`` and
``/dev/shm``, and the submission's own folder (writable; it holds the kernel's connection file and sockets). Not the
repository, ``grader/source``, the gradebook, the other submissions or the results. Limits: CPU seconds, address
space, processes, open files and file size (``prlimit``). The namespace's first process is bubblewrap's reaper: when
the kernel goes, or the grader that started it, every process of the submission goes with it.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from specdec.course.reference_calls import parse
from specdec.paths import DATA_DIR, REPO_ROOT

UID = 65534  # nobody
PACKAGE = REPO_ROOT / "solutions" / "specdec"
WITHHELD = ("checks", "mistakes")  # what judges a learner, and the wrong answers: never inside the sandbox

_STUB = '''"""Withheld while grading: the checks run outside this sandbox, in the grader."""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def withheld(*args, **kwargs):
        raise RuntimeError(f"{__name__}.{name} is not available while grading: the grader runs the tests itself")

    return withheld
'''


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 900
    memory_mb: int = 8192
    processes: int = 256
    open_files: int = 512
    file_mb: int = 256


def available() -> str | None:
    """None when a sandbox can start here; else why not."""
    if sys.platform != "linux":
        return "the sandbox needs Linux"
    for tool in ("bwrap", "setpriv", "prlimit"):
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install bubblewrap util-linux)"
    probe = subprocess.run(command(Path("/tmp"), Path("/tmp"), ["true"], Limits()), capture_output=True, text=True)
    if probe.returncode != 0:
        return f"bubblewrap could not start a sandbox: {probe.stderr.strip()[:300]}"
    return None


def graded_build(dest: Path, exercises: set[str]) -> Path:
    """A copy of the package for the sandbox: checks and mistakes replaced by stubs, and every top-level function
    named like one of ``exercises`` (the graded notebook's answers) guarded so that only the package's own code can
    call it (``specdec.course.withheld``). Returns the copy's root."""
    shutil.copytree(PACKAGE, dest / "specdec", ignore=shutil.ignore_patterns("__pycache__", *WITHHELD))
    for folder in WITHHELD:
        for module in (PACKAGE / folder).glob("*.py"):
            (dest / "specdec" / folder).mkdir(exist_ok=True)
            (dest / "specdec" / folder / module.name).write_text(_STUB)
    for path in (dest / "specdec").rglob("*.py"):
        if path.parts[-2] == "course":
            continue
        tree = parse(path.read_text())
        names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in exercises]
        if names:
            wrap = "".join(f"{n} = __import__('specdec.course.withheld', fromlist=['guard']).guard({n})\n"
                           for n in names)
            path.write_text(path.read_text() + "\n\n" + wrap)
    return dest


def command(own: Path, build: Path, cmd: list[str], limits: Limits, env: dict[str, str] | None = None) -> list[str]:
    """``cmd`` inside a sandbox whose only writable folder is ``own`` and whose package is ``build``."""
    python = Path(sys.base_prefix)
    venv = Path(sys.prefix)
    args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-net",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
            "--symlink", "usr/sbin", "/sbin", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--tmpfs", "/dev/shm", *_parents(python, venv, DATA_DIR, PACKAGE.parent, own),
            "--ro-bind", str(python), str(python), "--ro-bind", str(venv), str(venv),
            "--ro-bind", str(DATA_DIR), str(DATA_DIR), "--ro-bind", str(build), str(PACKAGE.parent),
            "--bind", str(own), str(own), "--chdir", str(own), "--clearenv"]
    base = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "MPLCONFIGDIR": "/tmp/mpl",
            "TRITON_CACHE_DIR": "/tmp/triton", "PYTHONNOUSERSITE": "1", "LANG": "C.UTF-8"}
    for key, value in {**base, **(env or {})}.items():
        args += ["--setenv", key, value]
    return [*args, "--", "setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--no-new-privs",
            "prlimit", f"--cpu={limits.cpu_s}", f"--as={limits.memory_mb * 2**20}", f"--nproc={limits.processes}",
            f"--nofile={limits.open_files}", f"--fsize={limits.file_mb * 2**20}", "--core=0", "--", *cmd]


def _parents(*paths: Path) -> list[str]:
    """bubblewrap makes the missing parents of a mount point private (0700): make them 0755 first."""
    made, args = {"/", "/tmp", "/usr", "/etc", "/dev", "/proc"}, []
    for path in paths:
        for parent in reversed(path.parents):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
    return args


def give(path: Path) -> None:
    """Let the sandbox's uid read and write ``path`` (a folder and what it holds)."""
    for root, dirs, files in os.walk(path):
        os.chown(root, UID, UID)
        for name in files:
            os.chown(os.path.join(root, name), UID, UID)
