"""Cohort grading's boxes (issue 51): a grader of its own uid, a kernel's box nested in it under a seccomp filter, and
limits that hold for a submission's whole process tree. Each test starts the real boxes (bubblewrap, cgroups) with a
small program in place of nbgrader and the kernel, so a limit is seen to hold in seconds."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from specdec.course import boxes, cohort, sandbox

pytestmark = pytest.mark.skipif(boxes.missing() is not None, reason=f"no sandbox here: {boxes.missing()}")
SLUG = "01_cost_ledger"


def _in_kernel_box(scratch: Path, payload: str, limits: sandbox.Limits) -> str:
    """Python run by a grader that starts ``payload`` in the kernel's box, as the cohort's grader does."""
    return ("import subprocess, sys; from pathlib import Path; from specdec.course import sandbox; "
            f"r = subprocess.run(sandbox.command(Path({str(scratch / 'sandbox')!r}), Path({str(sandbox.PACKAGE.parent)!r}), "
            f"[sys.executable, '-c', {payload!r}], sandbox.{limits!r})); sys.exit(r.returncode)")


def _run(payload: str, index: int, limits: sandbox.Limits = sandbox.Limits(), tree: boxes.Tree | None = None,
         wall_s: float = 120, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, str]:
    """``payload`` in a kernel's box started by a grader's box (of uid ``index``), in ``tree`` when given and watched
    as the cohort watches a submission (a whole-notebook limit of ``wall_s``): (the run, why it was stopped)."""
    with tempfile.TemporaryDirectory(prefix="specdec-boxes-") as tmp:
        scratch = Path(tmp) / "scratch"
        (scratch / "sandbox").mkdir(parents=True)
        uid = boxes.grader_uid(index)
        boxes.give(scratch, uid)
        cmd = boxes.command(uid, scratch, sandbox.PACKAGE.parent, SLUG,
                            [sys.executable, "-c", _in_kernel_box(scratch, payload, limits)],
                            {"PATH": "/usr/bin:/bin", "HOME": "/tmp", **(env or {})})
        if tree is not None:
            cmd = [sys.executable, "-c", cohort._JOIN, json.dumps(tree.procs_files()), *cmd]
        out = Path(tmp) / "log"
        with open(out, "w+") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, process_group=0)
            why = cohort._watch(proc, tree, cohort.Limits(wall_s, wall_s, 1024, False, True)) if tree else ""
            if tree is None:
                proc.wait(timeout=wall_s)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read_text(), ""), why


@contextlib.contextmanager
def _tree(name: str, memory_mb: int, tasks: int):
    """A submission's cgroup for one test: removed afterwards, with nothing of it left running."""
    tree = boxes.Tree(name, memory_mb, tasks)
    try:
        yield tree
    finally:
        tree.remove()
    assert not tree.pids()


SYSCALLS = r'''
import ctypes, errno, os, platform
libc = ctypes.CDLL(None, use_errno=True)
numbers = {"x86_64": {"keyctl": 250, "add_key": 248, "ptrace": 101, "unshare": 272, "mount": 165, "bpf": 321},
           "aarch64": {"keyctl": 219, "add_key": 217, "ptrace": 117, "unshare": 97, "mount": 40, "bpf": 280}}
for name, number in numbers[platform.machine()].items():
    result = libc.syscall(number, 0x10000000 if name == "unshare" else 0, 0, 0, 0, 0)
    print(name, result, errno.errorcode.get(ctypes.get_errno()))
print("uid", os.getuid())
'''


def test_the_kernel_box_refuses_the_keyring_tracing_mounts_and_namespaces():
    done, _ = _run(SYSCALLS, 1)
    assert done.returncode == 0, done.stdout
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    for name in ("keyctl", "add_key", "ptrace", "unshare", "mount", "bpf"):
        assert lines[name] == "-1 EPERM", (name, done.stdout)
    assert lines["uid"] == str(sandbox.UID)


def test_graders_run_as_distinct_unprivileged_uids_and_see_only_their_own_folder():
    uids = {boxes.grader_uid(i) for i in range(100)}
    assert len(uids) == 100 and min(uids) >= boxes.UID_BASE
    with tempfile.TemporaryDirectory(prefix="specdec-boxes-") as tmp:
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        uid = boxes.grader_uid(3)
        boxes.give(scratch, uid)
        probe = ("import os; from pathlib import Path\n"
                 "print(os.getuid(), os.geteuid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
                 f"print(Path({str(Path(tmp) / 'other')!r}).exists(), Path('/root').exists() and sorted(os.listdir('/root')))\n"
                 f"print(Path({str(boxes.SOURCE_DIR / '02_greedy_verify')!r}).exists(), "
                 f"Path({str(boxes.SOURCE_DIR / SLUG)!r}).exists())\n"
                 "import signal\n"
                 "try:\n    os.kill(1, signal.SIGTERM); print('signalled init')\nexcept PermissionError: print('no signal')\n")
        (Path(tmp) / "other").mkdir()
        done = subprocess.run(boxes.command(uid, scratch, sandbox.PACKAGE.parent, SLUG, [sys.executable, "-c", probe],
                                            {"PATH": "/usr/bin:/bin"}), capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert lines[0] == f"{uid} {uid} 0000000000000000", done.stdout + done.stderr
    assert lines[1].startswith("False"), lines  # another submission's folder is not there
    assert lines[2] == "False True", lines  # only this assignment's instructor notebook
    assert lines[3] == "no signal", lines


def test_a_fork_bomb_stops_at_the_trees_process_limit():
    bomb = ("import os, time\nmade = 0\n"
            "try:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30); os._exit(0)\n        made += 1\n"
            "except OSError:\n    print('stopped at', made)\n")
    with _tree("test-fork-bomb", 2048, 64) as tree:
        done, why = _run(bomb, 4, tree=tree, wall_s=60)
        assert "stopped at" in done.stdout, done.stdout
        made = int(done.stdout.split("stopped at")[1].split()[0])
        assert made < 64, made  # the grader's and the kernel's own tasks count too


def test_cpu_time_is_summed_over_the_whole_tree():
    spin = ("import os, time\n"
            "for _ in range(3):\n    if os.fork() == 0:\n        while True: pass\n"
            "time.sleep(120)\n")
    start = time.monotonic()
    with _tree("test-cpu", 2048, 256) as tree:
        _, why = _run(spin, 5, tree=tree, wall_s=4)  # the watchdog's CPU limit is the notebook's time limit
        assert "CPU time, summed over every process" in why or "time limit" in why, why
        assert time.monotonic() - start < 30
        assert tree.cpu_seconds() < 4 + 2 * 3, tree.cpu_seconds()  # stopped within a poll of the limit


def test_memory_is_limited_for_the_whole_tree():
    hog = ("import os, time\n"
           "for _ in range(3):\n    if os.fork() == 0:\n"
           "        block = bytearray(250 * 2**20)\n        block[::4096] = b'x' * len(block[::4096])\n"
           "        time.sleep(20); os._exit(0)\n"
           "deaths = [os.wait()[1] for _ in range(3)]\nprint('killed', sum(os.WIFSIGNALED(d) for d in deaths))\n")
    with _tree("test-memory", 600, 256) as tree:
        done, _ = _run(hog, 6, tree=tree, wall_s=90)
        assert "killed" in done.stdout, done.stdout
        killed = int(done.stdout.split("killed")[1].split()[0])
        assert killed >= 1 and tree.out_of_memory(), (done.stdout, killed)


def test_the_kernels_writable_folders_are_bounded():
    fill = ("import os\nwritten = 0\n"
            "try:\n    for i in range(100):\n        with open(f'/tmp/f{i}', 'wb') as f: f.write(b'x' * 2**20 * 8)\n"
            "        written += 8\nexcept OSError as err:\n    print('full after', written, err.errno)\n")
    done, _ = _run(fill, 7, limits=sandbox.Limits(file_mb=64))
    assert "full after" in done.stdout, done.stdout
    assert int(done.stdout.split("full after")[1].split()[0]) <= 64, done.stdout


ENVIRON = r'''
import os
first = open("/proc/1/environ", "rb").read()
print("salt in /proc/1/environ:", b"SPECDEC_CHECK_SALT" in first)
print("salt in os.environ:", "SPECDEC_CHECK_SALT" in os.environ)
'''


def test_the_runs_salt_never_reaches_the_kernels_box():
    """Issue 51's review: bubblewrap stays in the box as its first process, with the environment it was started
    with; started with the grader's, it showed the run's salt in /proc/1/environ."""
    done, _ = _run(ENVIRON, 8, env={"SPECDEC_CHECK_SALT": "the-secret"})
    assert "salt in /proc/1/environ: False" in done.stdout, done.stdout + done.stderr
    assert "salt in os.environ: False" in done.stdout, done.stdout


def test_a_link_is_never_bound_into_a_box(tmp_path):
    """Issue 51's review: a kernel that left a link where the grader's compile box takes its folder got the grader's
    own folder bound writable into a box running the kernel's source."""
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(ValueError, match="link"):
        sandbox.command(tmp_path / "link", sandbox.PACKAGE.parent, ["true"], sandbox.Limits())
    assert not cohort._plain_file(tmp_path / "link")
    (tmp_path / "target" / "file").write_text("x")
    assert cohort._plain_file(tmp_path / "target" / "file")
    assert not cohort._plain_file(tmp_path / "link" / "file"), "a link among the parents counts too"
