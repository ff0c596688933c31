"""The box a learner's kernel runs in for cohort grading, on bubblewrap (Debian's ``bubblewrap``).

The grader that starts it is itself unprivileged (``specdec.course.boxes``), so the kernel's box is made with a user
namespace: inside it the kernel is uid 65534 (nobody) with no capability outside, in its own PID, IPC, UTS, network,
cgroup and mount namespaces, unable to make further namespaces (``--disable-userns``), under a seccomp filter on the
lines of Docker's default profile (:func:`seccomp_filter`: no keyring, ``ptrace``, mounts, ``bpf``, ...). Its mount
namespace holds only the system's ``/usr`` and ``/etc``, the Python and virtual environment the course runs on, the
course's ``data/``, a *graded build* of the package (:func:`graded_build`), a private ``/tmp`` and ``/dev/shm`` (tmpfs
of bounded size), and the submission's own folder (it holds the kernel's sockets). Per-process limits (``prlimit``):
CPU seconds, address space, processes, open files, file size; limits on the whole tree come from the cgroup the
grader runs in. The namespace's first process is bubblewrap's reaper: when the kernel goes, or the grader that
started it, every process of the submission goes with it.
"""

from __future__ import annotations

import ast
import errno
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.course.reference_calls import parse
from specdec.paths import DATA_DIR, REPO_ROOT

UID = 65534  # nobody, inside the kernel's user namespace
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
    file_mb: int = 256  # one file, and each of the box's writable folders (/tmp and /dev/shm are tmpfs of this size)


#: What the kernel's seccomp filter refuses (EPERM), after Docker's default profile (moby/moby,
#: profiles/seccomp/default.json: the calls it allows only with a capability a container does not get): the kernel
#: keyring (shared by a uid across boxes), tracing and reading other processes, mounts and namespaces, kernel modules
#: and BPF, clocks, swap, reboot, accounting, NUMA policy, userfaultfd and io_uring. Names an architecture lacks are
#: skipped; calls of another architecture (i386's int 0x80, x32) kill the caller.
DENIED = ("add_key", "keyctl", "request_key", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
          "mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns", "open_tree", "move_mount",
          "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "open_by_handle_at", "name_to_handle_at",
          "bpf", "perf_event_open", "fanotify_init", "init_module", "finit_module", "delete_module", "create_module",
          "query_module", "get_kernel_syms", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
          "quotactl", "quotactl_fd", "lookup_dcookie", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl",
          "syslog", "vhangup", "iopl", "ioperm", "settimeofday", "stime", "clock_settime", "clock_adjtime",
          "adjtimex", "personality", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "mbind", "set_mempolicy", "move_pages", "vm86", "vm86old", "pidfd_getfd", "process_madvise")
AF_VSOCK = 40  # sockets to the host of a virtual machine: not in any namespace
#: What never enters a box's environment: the run's secret salt for the hidden tests' seeds.
PRIVATE = frozenset({"SPECDEC_CHECK_SALT"})
#: clone's flags that make a namespace (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME).
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)


def compile_filter(name: str, denied: Iterable[str], more: Callable[[Any, Any], None] | None = None) -> Path:
    """A seccomp filter as compiled BPF (bubblewrap's ``--seccomp``), built with libseccomp (PyPI's ``pyseccomp``):
    every call in ``denied`` that this architecture has answers EPERM, ``more(rules, seccomp)`` adds the rest, and
    everything else is allowed. Written where only root writes, readable by the boxes' uids."""
    import pyseccomp as seccomp  # Linux only, and only where cohort grading runs

    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    arch = seccomp.system_arch()
    for call in denied:
        if seccomp.resolve_syscall(arch, call) >= 0:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), call)
    if more is not None:
        more(rules, seccomp)
    path = Path(tempfile.mkdtemp(prefix="specdec-seccomp-")) / f"{name}.bpf"
    with open(path, "wb") as f:
        rules.export_bpf(f)
    path.chmod(0o644)
    path.parent.chmod(0o755)
    return path


@functools.cache
def seccomp_filter() -> Path:
    """The kernel's filter: DENIED, clone with a namespace flag, vsock sockets; clone3 answers ENOSYS, so the C
    library falls back to clone, whose flags the filter can read. Built once per process."""
    def more(rules: Any, seccomp: Any) -> None:
        for flag in NAMESPACE_FLAGS:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.EQ, AF_VSOCK))
        if seccomp.resolve_syscall(seccomp.system_arch(), "clone3") >= 0:
            rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")

    return compile_filter("kernel", DENIED, more)


def missing() -> str | None:
    """None when a kernel's box can start here; else what is missing."""
    if sys.platform != "linux":
        return "the sandbox needs Linux"
    for tool in ("bwrap", "prlimit"):
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install bubblewrap util-linux)"
    try:
        seccomp_filter()
    except (ImportError, OSError, RuntimeError) as err:
        return f"no seccomp filter ({type(err).__name__}: {err}; pip install pyseccomp, apt-get install libseccomp2)"
    probe = subprocess.run(command(Path("/tmp"), Path("/tmp"), ["true"], Limits()), capture_output=True, text=True)
    if probe.returncode != 0:
        return f"bubblewrap could not start a box with a user namespace: {probe.stderr.strip()[:300]}"
    return None


def graded_build(dest: Path, exercises: set[str]) -> Path:
    """A copy of the package for the sandbox, without the answers: checks and mistakes replaced by stubs; every
    top-level function named like one of ``exercises`` (the graded notebook's answers) cut out of the source, with a
    stand-in in its place that runs the learner's own (``specdec.course.withheld.LearnersOwn``); every helper that
    computes what one of them asks for (``specdec.course.equivalents``) watched. No bytecode is copied. Returns the
    copy's root."""
    from specdec.course.equivalents import EQUIVALENTS

    shutil.copytree(PACKAGE, dest / "specdec", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", *WITHHELD))
    for folder in WITHHELD:
        for module in (PACKAGE / folder).glob("*.py"):
            (dest / "specdec" / folder).mkdir(exist_ok=True)
            (dest / "specdec" / folder / module.name).write_text(_STUB)
    cut_references(dest / "specdec", exercises, {e: EQUIVALENTS.get(e, ()) for e in exercises})
    return dest


#: Lesson modules whose functions share an exercise's name without being its reference: the shipped decoder whose
#: bugs notebook 10 finds (its ``bonus_token`` is read, and must stay as shipped).
NOT_REFERENCES = ("buggy_decoder",)


def cut_references(package: Path, exercises: set[str], watched: dict[str, tuple[str, ...]] | None = None) -> None:
    """In a copy of the package at ``package``: every top-level function of the lessons named like one of
    ``exercises`` cut out of its source, a stand-in in its place that runs the learner's own
    (``specdec.course.withheld.LearnersOwn``); each helper in ``watched`` (exercise -> "module:function") wrapped by
    ``withheld.watch``. ``specdec.course`` is left as it is."""
    helpers: dict[str, list[tuple[str, str]]] = {}
    for exercise, names in (watched or {}).items():
        for helper in names:
            module, name = helper.split(":")
            helpers.setdefault(module, []).append((name, exercise))
    for path in package.rglob("*.py"):
        if path.relative_to(package).parts[0] == "course" or path.stem in NOT_REFERENCES:
            continue
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__")
        lines = path.read_text().splitlines(keepends=True)
        cut = [node for node in parse("".join(lines)).body if isinstance(node, ast.FunctionDef) and node.name in exercises]
        for node in sorted(cut, key=lambda n: n.lineno, reverse=True):  # from the bottom, so line numbers hold
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            lines[first:node.end_lineno] = [
                f"{node.name} = __import__('specdec.course.withheld', fromlist=['LearnersOwn'])"
                f".LearnersOwn({node.name!r}, {module!r})  # the reference is not in this copy of the package\n"]
        tail = "".join(f"{name} = __import__('specdec.course.withheld', fromlist=['watch']).watch({name}, {exercise!r})\n"
                       for name, exercise in helpers.get(module, []))
        if cut or tail:
            path.write_text("".join(lines) + ("\n\n" + tail if tail else ""))


def command(own: Path, build: Path, cmd: list[str], limits: Limits, env: dict[str, str] | None = None) -> list[str]:
    """``cmd`` inside a kernel's box whose only writable folders are ``own`` and its tmpfs, and whose package is
    ``build``. Run by an unprivileged process (the grader's uid is the box's uid outside); run as root, the box is
    started as nobody, so that it is never root outside its namespace."""
    if own.is_symlink() or not own.is_dir():
        raise ValueError(f"{own} is not a folder of its own (a link is never bound into a box)")
    python = Path(sys.base_prefix)
    venv = Path(sys.prefix)
    size = str(limits.file_mb * 2**20)
    args = ["bwrap", "--unshare-user", "--uid", str(UID), "--gid", str(UID), "--disable-userns",
            "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-net",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
            "--symlink", "usr/sbin", "/sbin", "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", size, "--tmpfs", "/tmp", "--perms", "1777", "--size", size, "--tmpfs",
            "/dev/shm", *_parents(python, venv, DATA_DIR, PACKAGE.parent, own),
            "--ro-bind", str(python), str(python), "--ro-bind", str(venv), str(venv),
            "--ro-bind", str(DATA_DIR), str(DATA_DIR), "--ro-bind", str(build), str(PACKAGE.parent),
            "--bind", str(own), str(own), "--chdir", str(own), "--clearenv", "--seccomp", "3"]
    base = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "MPLCONFIGDIR": "/tmp/mpl",
            "TRITON_CACHE_DIR": "/tmp/triton", "PYTHONNOUSERSITE": "1", "LANG": "C.UTF-8"}
    for key, value in {**base, **(env or {})}.items():
        if key not in PRIVATE:
            args += ["--setenv", key, value]
    args += ["--", "prlimit", f"--cpu={limits.cpu_s}", f"--as={limits.memory_mb * 2**20}",
             f"--nproc={limits.processes}", f"--nofile={limits.open_files}", f"--fsize={limits.file_mb * 2**20}",
             "--core=0", "--", *cmd]
    as_nobody = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups"] if os.geteuid() == 0 else []
    # bubblewrap reads the filter from a descriptor: the shell opens it as fd 3 and becomes bubblewrap. It starts
    # with an empty environment (env -i): bubblewrap's own process stays in the box as its first process, and its
    # environment would be readable there (/proc/1/environ), the grader's included
    return [*as_nobody, "/usr/bin/env", "-i", "/bin/sh", "-c", 'exec "$@" 3<"$0"', str(seccomp_filter()), *args]


def _parents(*paths: Path) -> list[str]:
    """bubblewrap makes the missing parents of a mount point private (0700): make them 0755 first."""
    made, args = {"/", "/tmp", "/usr", "/etc", "/dev", "/proc"}, []
    for path in paths:
        for parent in reversed(path.parents):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
    return args
