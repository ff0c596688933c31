"""The grader's own box, and limits on a submission's whole process tree (cohort grading).

Cohort grading runs three kinds of process. The *orchestrator* (``specdec.course.cohort``, root) keeps the
submissions, the results and the gradebook it writes them from. Per submission it starts a *grader* (nbgrader's
autograde with ``specdec.course.trusted``) in a box of its own, made here: a uid of its own that no other process has
(:func:`grader_uid`), no capability, a mount namespace that holds only the system, the Python environment, the
package, ``data/``, this assignment's instructor notebook and this submission's scratch folder (the only place it
can write, beside a bounded ``/tmp``), no network, and a seccomp filter. The grader starts the submission's *kernel*
in the kernel's box (``specdec.course.sandbox``), nested in its own, with a user namespace.

Limits on the whole tree (the grader, the kernel and anything they start) come from a cgroup per submission
(:class:`Tree`): memory, process count, an equal CPU share whatever the number of processes (a fork bomb gets what
one honest kernel gets), CPU time summed over the tree (a watchdog reads it), and at the end every process in the
cgroup is killed, so nothing a submission starts outlives its grading. cgroup v1 (the ``memory``, ``pids``, ``cpu``,
``cpuacct`` and ``freezer`` hierarchies) and cgroup v2 (``memory``, ``pids``, ``cpu`` controllers) are both read.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specdec.course import sandbox
from specdec.paths import DATA_DIR, SOURCE_DIR

#: Graders' uids: this range is assumed free of real users (ids above 10^9 are not handed out by useradd).
UID_BASE = 1_000_000_000
CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_HIERARCHIES = ("memory", "pids", "cpu", "cpuacct", "freezer")
PARENT = "specdec-cohort"
REMOVE_S = 60.0  # most seconds a submission's cgroup waits for its killed tasks to leave
GRADER_TMP_MB = 512  # the grader's /tmp (a tmpfs; its pages count against the tree's memory)

#: The grader's filter: the kernel's, less what bubblewrap needs to make the kernel's box (mounts, namespaces).
GRADER_ALLOWED = {"mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns", "open_tree", "move_mount",
                  "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"}


def grader_uid(index: int) -> int:
    """The uid of the grader of a run's ``index``-th submission: distinct within a run, and across runs started side
    by side on one machine (by the orchestrator's process id)."""
    return UID_BASE + (os.getpid() % 100_000) * 10_000 + index % 10_000


@functools.cache
def grader_filter() -> Path:
    """The grader's filter: the kernel's list, less the mounts and namespaces bubblewrap needs to make the kernel's
    box."""
    return sandbox.compile_filter("grader", [call for call in sandbox.DENIED if call not in GRADER_ALLOWED])


def command(uid: int, scratch: Path, build: Path, slug: str, cmd: list[str], env: dict[str, str]) -> list[str]:
    """``cmd`` as the grader of one submission: run by root, it drops to ``uid`` inside a box that sees ``scratch``
    (writable, owned by ``uid``), the graded ``build`` (read-only, for the kernel's box) and ``slug``'s instructor
    notebook, and nothing of the other submissions, the results or the rest of the course."""
    python, venv = Path(sys.base_prefix), Path(sys.prefix)
    source = SOURCE_DIR / slug
    own = scratch / "sandbox"
    args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "grader",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
            "--symlink", "usr/sbin", "/sbin",
            # the host's /proc, unmasked: the kernel's box mounts a /proc of its own only where one is fully visible
            # (the grader sees other processes' ids, and signals or reads none: their uids are not its own)
            "--bind", "/proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(GRADER_TMP_MB * 2**20), "--tmpfs", "/tmp",
            *sandbox._parents(python, venv, sandbox.PACKAGE.parent, DATA_DIR, source, build, scratch),
            "--ro-bind", str(python), str(python), "--ro-bind", str(venv), str(venv),
            "--ro-bind", str(sandbox.PACKAGE.parent), str(sandbox.PACKAGE.parent),
            "--ro-bind", str(DATA_DIR), str(DATA_DIR), "--ro-bind", str(source), str(source),
            "--ro-bind", str(build), str(build), "--bind", str(scratch), str(scratch),
            "--chdir", str(scratch), "--clearenv", "--seccomp", "3"]
    if own.is_dir():  # the kernel's folder: a tmpfs of bounded size (its pages count against the tree's memory)
        args += ["--perms", "1777", "--size", str(sandbox.Limits().file_mb * 2**20), "--tmpfs", str(own)]
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += ["--", "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--", *cmd]
    return ["/bin/sh", "-c", 'exec "$@" 3<"$0"', str(grader_filter()), *args]


def give(path: Path, uid: int) -> None:
    """Hand ``path`` (a folder and what it holds, links not followed) to ``uid``."""
    for root, dirs, files in os.walk(path):
        os.chown(root, uid, uid, follow_symlinks=False)
        for name in files + dirs:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


# -- the whole tree ----------------------------------------------------------------------------------------------


def _v2() -> bool:
    controllers = CGROUP_ROOT / "cgroup.controllers"
    return controllers.exists() and {"memory", "pids", "cpu"} <= set(controllers.read_text().split())


def cgroups_missing() -> str | None:
    """None when this process can make a cgroup per submission; else why not."""
    if os.geteuid() != 0:
        return "limits on a submission's whole process tree need root (cgroups)"
    if _v2():
        return None
    absent = [h for h in V1_HIERARCHIES[:4] if not (CGROUP_ROOT / h / "cgroup.procs").exists()]
    if absent:
        return f"no cgroup v2 with memory, pids and cpu, and no cgroup v1 hierarchy for {', '.join(absent)}"
    return None


class Tree:
    """The cgroup of one submission: its grader, its kernel and what they start."""

    def __init__(self, name: str, memory_mb: int, processes: int):
        self.v2 = _v2()
        if self.v2:
            parent = CGROUP_ROOT / PARENT
            parent.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text("+memory +pids +cpu")
            self.dirs = {h: parent / name for h in ("memory", "pids", "cpu", "cpuacct", "freezer")}
            self.dirs["memory"].mkdir()
        else:
            self.dirs = {h: CGROUP_ROOT / h / PARENT / name for h in V1_HIERARCHIES if (CGROUP_ROOT / h).is_dir()}
            for folder in set(self.dirs.values()):
                folder.mkdir(parents=True)
        memory = str(memory_mb * 2**20)
        if self.v2:
            self._write("memory", "memory.max", memory)
            self._write("memory", "memory.swap.max", "0", optional=True)
            self._write("pids", "pids.max", str(processes))
        else:
            self._write("memory", "memory.limit_in_bytes", memory)
            self._write("memory", "memory.memsw.limit_in_bytes", memory, optional=True)
            self._write("pids", "pids.max", str(processes))
        self.started = time.monotonic()

    def _write(self, hierarchy: str, name: str, value: str, optional: bool = False) -> None:
        try:
            (self.dirs[hierarchy] / name).write_text(value)
        except OSError:
            if not optional:
                raise

    def procs_files(self) -> list[str]:
        """What a process writes its id into to join the tree (every hierarchy's ``cgroup.procs``)."""
        return sorted({str(folder / "cgroup.procs") for folder in self.dirs.values()})

    def pids(self) -> list[int]:
        found: set[int] = set()
        for folder in set(self.dirs.values()):
            with contextlib.suppress(OSError):
                found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
        return sorted(found)

    def cpu_seconds(self) -> float:
        """CPU time used by every process of the tree so far, living or dead."""
        try:
            if self.v2:
                stat = dict(line.split() for line in (self.dirs["cpu"] / "cpu.stat").read_text().splitlines())
                return int(stat["usage_usec"]) / 1e6
            return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
        except (OSError, KeyError, ValueError):
            return 0.0

    def out_of_memory(self) -> bool:
        """True when the kernel's OOM killer acted inside the tree."""
        try:
            if self.v2:
                events = dict(line.split() for line in (self.dirs["memory"] / "memory.events").read_text().splitlines())
                return int(events.get("oom_kill", 0)) > 0
            control = (self.dirs["memory"] / "memory.oom_control").read_text()
            return any(line == "oom_kill 1" or (line.startswith("oom_kill ") and line != "oom_kill 0")
                       for line in control.splitlines())
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        """Kill every process of the tree (frozen first where the freezer is mounted, so none forks meanwhile)."""
        if self.v2:
            with contextlib.suppress(OSError):
                (self.dirs["memory"] / "cgroup.kill").write_text("1")
        freezer = self.dirs.get("freezer") if not self.v2 else None
        if freezer:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("FROZEN")
        for _ in range(200):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if freezer:
                with contextlib.suppress(OSError):
                    (freezer / "freezer.state").write_text("THAWED")  # killed tasks die once thawed
            time.sleep(0.02)
        if freezer:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("THAWED")

    def remove(self) -> bool:
        """Kill what is left and remove the cgroup; False if it could not be removed. Killed tasks can take seconds to
        leave on a loaded machine (a kernel freeing its memory): the removal waits up to REMOVE_S for them, killing
        again as it goes."""
        deadline = time.monotonic() + REMOVE_S
        for folder in sorted(set(self.dirs.values())):
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # the last tasks still leaving
                    if time.monotonic() > deadline:
                        return False
                    self.kill()
                    time.sleep(0.1)
        return True


def missing() -> str | None:
    """None when cohort grading's boxes can all start here (the grader's, the kernel's nested in it, the tree's
    cgroup); else the first piece that is missing."""
    why = sandbox.missing() if os.geteuid() != 0 else None
    if os.geteuid() != 0:
        return why or "the graders' own uids and boxes need root"
    for tool in ("bwrap", "setpriv", "prlimit"):
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install bubblewrap util-linux)"
    try:
        grader_filter()
        sandbox.seccomp_filter()
    except (ImportError, OSError, RuntimeError) as err:
        return f"no seccomp filter ({type(err).__name__}: {err}; pip install pyseccomp, apt-get install libseccomp2)"
    why = cgroups_missing()
    if why:
        return why
    return _probe()


@functools.cache
def _probe() -> str | None:
    """Start a grader's box and a kernel's box inside it, once."""
    with tempfile.TemporaryDirectory(prefix="specdec-probe-") as tmp:
        scratch = Path(tmp) / "scratch"
        (scratch / "sandbox").mkdir(parents=True)
        build = Path(tmp) / "build"
        build.mkdir()
        uid = grader_uid(9_999)
        give(scratch, uid)
        inner = ("import subprocess, sys; from pathlib import Path; from specdec.course import sandbox; "
                 f"sys.exit(subprocess.run(sandbox.command(Path({str(scratch / 'sandbox')!r}), Path({str(build)!r}), "
                 "['true'], sandbox.Limits())).returncode)")
        slug = next((p.name for p in sorted(SOURCE_DIR.iterdir()) if p.is_dir()), "")
        probe = subprocess.run(command(uid, scratch, build, slug, [sys.executable, "-c", inner],
                                       {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}),
                               capture_output=True, text=True, timeout=120)
        if probe.returncode != 0:
            return f"bubblewrap could not start a grader's box with a kernel's box inside: {probe.stderr.strip()[:300]}"
    return None
