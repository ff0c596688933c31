"""A real JupyterHub on loopback, for tests of nbgrader's exchange as a course runs it: local Unix accounts (one
instructor, some students) that log in with their passwords (PAM), each with a single-user Jupyter server started by
the hub as that account (LocalProcessSpawner), nbgrader's exchange folder shared by all, and the instructor's server
running formgrader on the course.

Everything (accounts' homes, exchange, hub database and secrets, logs) lives under one ``root`` folder, which must be
reachable by every user. The accounts are named with ``PREFIX`` and removed again at exit. Run as root.

The single-user servers run the course's virtual environment (this Python's ``sys.prefix``), but not its
interpreter in place: a venv's interpreter is a link to its base Python (here pyenv's under /root, mode 700, out of
other users' reach), so a copy of the base Python (interpreter, libpython, standard library) goes under
``root/python`` and a venv ``root/venv`` on it links the course venv's site-packages, etc/ and share/ (so the same
packages and the same enabled server extensions: nbgrader's formgrader and assignment_list), with copies of the
venv's console scripts that name the copy's interpreter.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

#: Every account the harness creates is named PREFIX + a short name (``alice`` -> ``sdhub-alice``).
PREFIX = "sdhub-"
VENV = Path(sys.prefix)
#: configurable-http-proxy from npm (`npm install --prefix .venv/hub configurable-http-proxy@5.2.0`), or the one
#: $CONFIGURABLE_HTTP_PROXY names.
CHP = Path(os.environ.get("CONFIGURABLE_HTTP_PROXY", VENV / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"))
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Seconds to wait for the hub, for a single-user server, and for an exchange or nbgrader call.
START_TIMEOUT, SERVER_TIMEOUT, CALL_TIMEOUT = 60, 90, 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 60) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else ["(missing)"]
    return f"--- {path}\n" + "\n".join(text[-lines:])


def _listening_ports() -> set[int]:
    """The TCP ports something on this host listens on (IPv4 and IPv6)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _processes_of(uids: set[int]) -> dict[int, str]:
    """Command lines, by pid, of the processes running as any of ``uids``."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
            if uid in uids:
                found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, StopIteration):  # it ended while being read
            continue
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _kill(pids: set[int]) -> None:
    """SIGKILL each of ``pids``, and wait (up to 10 s) until they are gone."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)


def _check_reachable(root: Path) -> None:
    """Fail unless every user may traverse to ``root`` (the homes and the exchange are below it)."""
    closed = [p for p in [root, *root.parents] if not p.stat().st_mode & 0o001]
    if closed:
        raise RuntimeError(f"other users cannot traverse {', '.join(map(str, closed))}: pick a root they can reach")


def _user_python(root: Path) -> Path:
    """A Python every account can run with the course venv's packages: ``root/venv/bin/python3`` (see the module's
    docstring). The account's processes need ``LD_LIBRARY_PATH=root/python/lib`` (libpython's RUNPATH names the
    original's folder)."""
    base, venv = root / "python", root / "venv"
    (base / "bin").mkdir(parents=True)
    (base / "lib").mkdir()
    shutil.copy2(Path(sys.base_prefix, "bin", "python{}.{}".format(*sys.version_info)), base / "bin" / "python3")
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libpython = sysconfig.get_config_var("INSTSONAME")
        shutil.copy2(Path(sysconfig.get_config_var("LIBDIR")) / libpython, base / "lib" / libpython)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    shutil.copytree(stdlib, base / "lib" / stdlib.name, symlinks=True,
                    ignore=shutil.ignore_patterns("site-packages", "test", "idlelib", "tkinter", "turtledemo"))
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").symlink_to(base / "bin" / "python3")
    (venv / "bin" / "python").symlink_to("python3")
    for script in (VENV / "bin").iterdir():  # console scripts (nbgrader runs `alembic`), on the copy's interpreter
        head, _, rest = script.read_bytes().partition(b"\n") if script.is_file() else (b"", b"", b"")
        if head.startswith(f"#!{VENV}/bin/python".encode()) and not (venv / "bin" / script.name).exists():
            (venv / "bin" / script.name).write_bytes(f"#!{venv}/bin/python3\n".encode() + rest)
            (venv / "bin" / script.name).chmod(0o755)
    site = Path(sysconfig.get_paths()["purelib"]).relative_to(VENV)  # lib/python3.11/site-packages
    (venv / site).parent.mkdir(parents=True)
    (venv / site).symlink_to(VENV / site)
    for shared in ("etc", "share"):  # the enabled server extensions, kernelspecs, lab extensions
        (venv / shared).symlink_to(VENV / shared)
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\ninclude-system-site-packages = false\n"
                                     f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
    return venv / "bin" / "python3"


@dataclass
class Hub:
    """A running hub and the accounts it serves. Users are named by their short names (``"alice"``);
    ``accounts`` maps them to their Unix and hub names, which are also nbgrader's student ids."""

    root: Path
    course_id: str
    course_dir: Path
    instructor: str
    students: list[str]
    accounts: dict[str, str] = field(default_factory=dict)
    passwords: dict[str, str] = field(default_factory=dict)
    url: str = ""
    python: Path = Path()
    ports: dict[str, int] = field(default_factory=dict)
    _service_token: str = field(default_factory=lambda: secrets.token_hex(32))
    _tokens: dict[str, str] = field(default_factory=dict)
    _proc: subprocess.Popen | None = None
    _uids: set[int] = field(default_factory=set)
    _http: requests.Session = field(default_factory=requests.Session)

    def __post_init__(self) -> None:
        self._http.trust_env = False  # no HTTP(S)_PROXY for loopback

    # --- the hub and its API -----------------------------------------------------------------------------------

    def hub_api(self, method: str, path: str, body: Any = None, token: str | None = None,
                check: bool = True) -> requests.Response:
        """``/hub/api/<path>`` through the proxy, with the harness service's admin token unless ``token``."""
        return self._request(method, f"{self.url}/hub/api/{path}", token or self._service_token, body, check)

    def token(self, user: str) -> str:
        """An API token of ``user``'s own, asked of the hub with the account's password (checked by PAM)."""
        if user not in self._tokens:
            auth = {"username": self.accounts[user], "password": self.passwords[user]}
            response = self._request("POST", f"{self.url}/hub/api/users/{self.accounts[user]}/tokens", None,
                                     {"auth": auth, "note": "sdhub test"})
            self._tokens[user] = response.json()["token"]
        return self._tokens[user]

    def login(self, user: str) -> requests.Session:
        """A browser's session after logging in on the hub's login form with ``user``'s password."""
        session = requests.Session()
        session.trust_env = False  # no HTTP(S)_PROXY for loopback
        session.get(f"{self.url}/hub/login", timeout=30).raise_for_status()
        form = {"username": self.accounts[user], "password": self.passwords[user], "_xsrf": session.cookies["_xsrf"]}
        response = session.post(f"{self.url}/hub/login", data=form, allow_redirects=False, timeout=30)
        if response.status_code != 302:
            raise AssertionError(f"login of {user} answered {response.status_code}\n{self.logs()}")
        return session

    def spawn(self, user: str) -> None:
        """Ask the hub, as ``user`` with their token, to start their single-user server; returns at once."""
        self.hub_api("POST", f"users/{self.accounts[user]}/server", token=self.token(user))

    def wait_ready(self, user: str) -> None:
        """Until ``user``'s server is up and routed through the proxy."""
        name, deadline = self.accounts[user], time.monotonic() + SERVER_TIMEOUT
        while not (server := self.hub_api("GET", f"users/{name}").json()["servers"].get("", {})).get("ready"):
            if time.monotonic() > deadline:
                raise AssertionError(f"the server of {name} is not ready after {SERVER_TIMEOUT} s: {server}\n{self.logs()}")
            time.sleep(0.3)

    def start_server(self, user: str) -> None:
        """Start ``user``'s single-user server and wait until it is ready."""
        self.spawn(user)
        self.wait_ready(user)

    def api(self, user: str, method: str, path: str, body: Any = None, check: bool = True) -> requests.Response:
        """``/user/<account>/<path>`` (``path`` may carry a query) on ``user``'s server through the proxy, with
        ``user``'s token; fails, showing the logs, on an HTTP error unless ``check`` is false."""
        url = f"{self.url}/user/{self.accounts[user]}/{path}"
        return self._request(method, url, self.token(user), body, check)

    # --- what JupyterLab's Assignments tab calls (nbgrader's assignment_list server extension) -------------------

    def list_assignments(self, user: str) -> list[dict]:
        """GET assignments?course_id=: released, fetched and submitted assignments of the course, as the user sees them."""
        return self._exchange(user, "GET", f"assignments?course_id={self.course_id}")

    def fetch(self, user: str, assignment: str) -> list[dict]:
        """POST assignments/fetch: copy the released assignment into the user's home; returns the new listing."""
        listing = self._action(user, "fetch", assignment)
        if not any(a["assignment_id"] == assignment and a["status"] == "fetched" for a in listing):
            raise AssertionError(f"{user} did not fetch {assignment}: {listing}\n{self.logs()}")
        return listing

    def submit(self, user: str, assignment: str) -> list[dict]:
        """POST assignments/submit: hand the fetched assignment in; returns the new listing."""
        return self._action(user, "submit", assignment)

    def fetch_feedback(self, user: str, assignment: str) -> list[dict]:
        """POST assignments/fetch_feedback: copy released feedback into ``~/<assignment>/feedback/<timestamp>/``;
        returns the new listing."""
        return self._action(user, "fetch_feedback", assignment)

    def _action(self, user: str, action: str, assignment: str) -> list[dict]:
        return self._exchange(user, "POST", f"assignments/{action}",
                              {"course_id": self.course_id, "assignment_id": assignment})

    def _exchange(self, user: str, method: str, path: str, body: Any = None) -> list[dict]:
        """An assignment_list call; nbgrader answers ``{"success": bool, "value": ...}`` with status 200 either way."""
        answer = self.api(user, method, path, body).json()
        if not answer["success"]:
            raise AssertionError(f"{method} {path} for {user} failed: {answer['value']}\n{self.logs()}")
        return answer["value"]

    # --- files and formgrader ------------------------------------------------------------------------------------

    def put_file(self, user: str, path: str, data: bytes) -> None:
        """Save ``data`` at ``path`` (relative to the user's home) through the contents API, as an editor saves."""
        body = {"type": "file", "format": "base64", "content": base64.b64encode(data).decode()}
        self.api(user, "PUT", f"api/contents/{path}", body)

    def get_file(self, user: str, path: str) -> bytes:
        """The bytes at ``path`` (relative to the user's home) through the contents API."""
        model = self.api(user, "GET", f"api/contents/{path}?type=file&format=base64&content=1").json()
        return base64.b64decode(model["content"])

    def formgrader(self, method: str, path: str, body: Any = None, check: bool = True) -> Any:
        """``formgrader/api/<path>`` on the instructor's server; the answer's JSON."""
        return self.api(self.instructor, method, f"formgrader/api/{path}", body, check).json()

    # --- commands run as an account --------------------------------------------------------------------------------

    @property
    def python_env(self) -> dict[str, str]:
        """What every account's processes need in their environment: the copied Python first on PATH, and its
        libpython."""
        return {"PATH": f"{self.python.parent}:{SYSTEM_PATH}", "LD_LIBRARY_PATH": str(self.root / "python" / "lib"),
                "LANG": "C.UTF-8"}

    def env(self, user: str) -> dict[str, str]:
        """The environment of ``user``'s commands, as a login would set it up (the hub sets the same for servers)."""
        name = self.accounts[user]
        return {"HOME": pwd.getpwnam(name).pw_dir, "USER": name, "LOGNAME": name, **self.python_env}

    def run_as(self, user: str, *cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
        """Run ``cmd`` as ``user`` (setuid, as runuser does) with their environment; fails with its output."""
        account = pwd.getpwnam(self.accounts[user])
        done = subprocess.run([str(c) for c in cmd], cwd=cwd or account.pw_dir, env=self.env(user), user=account.pw_uid,
                              group=account.pw_gid, extra_groups=[], capture_output=True, text=True, timeout=CALL_TIMEOUT)
        if done.returncode:
            raise AssertionError(f"{' '.join(map(str, cmd))} as {user} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done

    def nbgrader(self, *args: str) -> subprocess.CompletedProcess:
        """``nbgrader <args>`` as the instructor, in the course folder."""
        return self.run_as(self.instructor, self.python, "-m", "nbgrader", *args, cwd=self.course_dir)

    # --- shutting down ---------------------------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Stop the hub as an admin would (SIGTERM: it stops every single-user server, then the proxy), then kill
        whatever is left. Returns what was left 10 s after the hub ended (processes of the accounts, the hub or the
        proxy, ports still listening): empty when it cleaned up fully."""
        if self._proc is None:
            return []
        proxy = self.root / "hub" / "proxy.pid"
        started = {self._proc.pid, *([int(proxy.read_text())] if proxy.exists() else [])}
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        ours = set(self.ports.values())

        def left() -> list[str]:
            processes = {pid: "(the hub or its proxy)" for pid in started if _alive(pid)} | _processes_of(self._uids)
            return ([f"process {pid}: {cmd[:160]}" for pid, cmd in processes.items()]
                    + [f"port {port} listening" for port in sorted(ours & _listening_ports())])

        deadline = time.monotonic() + 10
        while (found := left()) and time.monotonic() < deadline:
            time.sleep(0.2)
        _kill({pid for pid in started if _alive(pid)} | set(_processes_of(self._uids)))
        return found

    def logs(self) -> str:
        """The end of the hub's log (with the proxy's) and of each single-user server's, for a failure message."""
        return "\n".join(_tail(p) for p in sorted((self.root / "logs").glob("*.log")))

    # --- setting up --------------------------------------------------------------------------------------------------

    def _request(self, method: str, url: str, token: str | None, body: Any = None, check: bool = True) -> requests.Response:
        headers = {"Authorization": f"token {token}"} if token else {}
        response = self._http.request(method, url, headers=headers, json=body, timeout=CALL_TIMEOUT)
        if check and response.status_code >= 400:
            raise AssertionError(f"{method} {url} answered {response.status_code}: {response.text[:2000]}\n{self.logs()}")
        return response

    def _create_accounts(self, course: Path) -> None:
        """The Unix accounts (homes under root/home, mode 700), their passwords and nbgrader configs; the course
        copied into the instructor's home (formgrader needs it below the server's root folder) and owned by them."""
        (self.root / "home").mkdir()
        for user in [self.instructor, *self.students]:
            name = self.accounts[user] = PREFIX + user
            _remove_account(name)  # left by an interrupted run
            home = self.root / "home" / name
            subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash",
                            "--user-group", name], check=True, capture_output=True)
            self._uids.add(pwd.getpwnam(name).pw_uid)
            home.chmod(0o700)
            self.passwords[user] = secrets.token_urlsafe(16)
            subprocess.run(["chpasswd"], input=f"{name}:{self.passwords[user]}", text=True, check=True)
            config = [f"c.CourseDirectory.course_id = {self.course_id!r}", f"c.Exchange.root = {str(self.exchange)!r}"]
            if user == self.instructor:
                config.append(f"c.CourseDirectory.root = {str(self.course_dir)!r}")
            (home / ".jupyter").mkdir()
            (home / ".jupyter" / "nbgrader_config.py").write_text("c = get_config()  # noqa: F821\n" + "\n".join(config) + "\n")
        shutil.copytree(course, self.course_dir)
        for user in [self.instructor, *self.students]:
            subprocess.run(["chown", "-R", f"{self.accounts[user]}:", self.root / "home" / self.accounts[user]], check=True)

    @property
    def exchange(self) -> Path:
        return self.root / "exchange"

    def _write_config(self) -> Path:
        self.ports.update(public=_free_port(), proxy_api=_free_port(), hub=_free_port())
        self.ports.update({name: _free_port() for name in self.accounts.values()})
        self.url = f"http://127.0.0.1:{self.ports['public']}"
        state, logs = self.root / "hub", self.root / "logs"
        settings = {
            "accounts": sorted(self.accounts.values()),
            "python": str(self.python),
            "chp": str(CHP),
            "logs": str(logs),
            "ports": {name: self.ports[name] for name in self.accounts.values()},
            "env": self.python_env,
        }
        config = state / "jupyterhub_config.py"
        config.write_text(f'''\
"""Written by tests_hub/hub.py."""
import json
import subprocess

settings = json.loads({json.dumps(settings)!r})
c = get_config()  # noqa: F821
c.JupyterHub.bind_url = "{self.url}/"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {self.ports["hub"]}
c.JupyterHub.db_url = "sqlite:///{state}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{state}/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = "{state}/jupyterhub.pid"
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}  # POST .../server answers at once (202)
c.ConfigurableHTTPProxy.command = [settings["chp"]]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.ports["proxy_api"]}"
c.ConfigurableHTTPProxy.auth_token = "{secrets.token_hex(32)}"
c.ConfigurableHTTPProxy.pid_file = "{state}/proxy.pid"

c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False
c.Authenticator.allowed_users = set(settings["accounts"])

c.JupyterHub.services = [{{"name": "sdhub-harness", "api_token": "{self._service_token}"}}]
c.JupyterHub.load_roles = [{{"name": "sdhub-harness", "services": ["sdhub-harness"],
                             "scopes": ["admin:users", "admin:servers", "tokens", "list:users"]}}]

c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [settings["python"], "-m", "jupyterhub.singleuser"]
c.Spawner.ip = "127.0.0.1"
c.Spawner.environment = settings["env"]
c.Spawner.start_timeout = {SERVER_TIMEOUT}
c.Spawner.http_timeout = {SERVER_TIMEOUT}
c.LocalProcessSpawner.interrupt_timeout = 10
c.LocalProcessSpawner.term_timeout = 10


def before_spawn(spawner):
    """Each single-user server on its own port, known to the harness, with its output in logs/<account>.log."""
    spawner.port = settings["ports"][spawner.user.name]
    log = open(f"{{settings['logs']}}/{{spawner.user.name}}.log", "ab")
    spawner.popen_kwargs = {{"stdout": log, "stderr": subprocess.STDOUT}}


c.Spawner.pre_spawn_hook = before_spawn
''')
        return config

    def _start(self) -> None:
        self.python = _user_python(self.root)
        self.exchange.mkdir()
        self.exchange.chmod(0o1777)  # as /srv/nbgrader/exchange: everyone writes, only owners remove
        (self.root / "hub").mkdir(mode=0o700)
        logs = self.root / "logs"
        logs.mkdir()
        config = self._write_config()
        env = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "HOME": str(self.root / "hub")}
        with open(logs / "hub.log", "ab") as log:
            self._proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=self.root / "hub",
                                          env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if self._http.get(f"{self.url}/hub/api/", timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the hub did not come up (exit status {self._proc.poll()})\n{self.logs()}")
            time.sleep(0.3)


def _remove_account(name: str) -> None:
    """Remove the account ``name`` and its group, if there is one, killing its processes first (its home stays: it
    is under a root folder)."""
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return
    _kill(set(_processes_of({uid})))
    subprocess.run(["userdel", name], check=True, capture_output=True)


@contextmanager
def running_hub(root: Path, course_id: str, course: Path, instructor: str, students: list[str]) -> Iterator[Hub]:
    """A hub serving ``instructor`` and ``students`` (short names, accounts ``PREFIX + name``), ready for calls.

    ``course`` (an nbgrader course folder) is copied to ``<instructor's home>/course``: ``Hub.course_dir``.
    ``root`` must exist and be reachable by every user. On exit the hub and everything it started are stopped and
    the accounts removed, even on failure; on failure the end of every log is printed (all under ``root/logs``)."""
    if os.geteuid() != 0:
        raise RuntimeError("the hub spawns servers as other users and creates their accounts: run as root")
    if not CHP.exists():
        raise RuntimeError(f"no configurable-http-proxy at {CHP}: npm install --prefix {VENV}/hub configurable-http-proxy")
    _check_reachable(root)
    hub = Hub(root, course_id, root / "home" / (PREFIX + instructor) / "course", instructor, list(students))
    try:
        hub._create_accounts(course)
        hub._start()
        yield hub
    except BaseException:
        print(hub.logs())
        raise
    finally:
        hub.stop()
        for name in hub.accounts.values():
            _remove_account(name)
