"""Run a Python script in a process of its own that starts without paying for the imports (a fork server per test
worker).

A launched ``python script.py`` spends about 10 s of a CPU importing torch, transformers and sentence-transformers
before it does anything, and the suite launches dozens. :func:`run` runs the script (or ``-m`` module) in a process forked from a
server that imported them once (:data:`PRELOAD`, nothing of hf_cocodr's): the process is as real as a launched one
(its own pid, memory, signals, file descriptors and exit status: killed by SIGKILL it reports ``-9``), runs the script
as ``__main__`` with the arguments, environment and working folder given, and its standard output and error are
captured. The result is the :class:`subprocess.CompletedProcess` that ``subprocess.run(..., capture_output=True,
text=True)`` gives.

What a fork cannot give, a launch does: where the environment differs from the server's in a variable that a
preloaded library reads when it is imported (:data:`READ_AT_IMPORT`: the Hub's endpoint and offline switch, thread
counts, ...), the script is launched with ``subprocess.run`` instead. Tests of what a fresh interpreter imports launch
``python -c`` themselves.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PRELOAD = ("torch", "transformers", "transformers.trainer", "sentence_transformers")
READ_AT_IMPORT = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "TOKENIZERS_", "PYTHON")
# read when they are used: hf_cocodr's own (hf_cocodr is not preloaded), the path (the child puts it first), the
# thread count (the child sets torch's from it), the compiler cache folder that importing torch's compiler sets in the
# tests' own process
OWN = ("HF_COCODR_", "PYTHONPATH", "OMP_NUM_THREADS", "TORCHINDUCTOR_CACHE_DIR")

_lock = threading.Lock()
_server = None
_server_env = dict(os.environ)  # the suite's environment as it was when the tests began (conftest imports this)


# ------------------------------------------------------------------------------------------------ the server side
def _child(request: dict) -> int:
    """In the forked process: become ``python SCRIPT ARGS`` in the request's environment; its exit status."""
    import atexit
    import runpy
    import traceback

    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # (the server's imports may have fixed it: read $TMPDIR again)
    if request["cwd"]:
        os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)
        os.close(handle)
    script, module = request["script"], request["module"]
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    first = os.getcwd() if module else str(Path(script).resolve().parent)  # as `python -m` and `python SCRIPT` do
    sys.path[:1] = [first, *extra]
    sys.argv = [module or script, *request["args"]]
    if "OMP_NUM_THREADS" in request["env"]:
        import torch

        torch.set_num_threads(int(request["env"]["OMP_NUM_THREADS"]))
    code = 0
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # a forked child leaves through os._exit, which runs no atexit handler
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _serve() -> None:
    """The server: import :data:`PRELOAD`, then for each request line fork a monitor, which forks the child, says its
    pid, waits for it and says its exit status (so that several children, the ranks of one run, run at once)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the monitors are reaped by the system
    replies = sys.stdout.fileno()
    for line in sys.stdin:
        request = json.loads(line)
        if os.fork() != 0:
            continue
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the monitor waits for its child
        code = 1
        try:
            pid = os.fork()
            if pid == 0:
                try:
                    code = _child(request)
                finally:
                    os._exit(code)
            os.write(replies, (json.dumps({"id": request["id"], "pid": pid}) + "\n").encode())
            _, status = os.waitpid(pid, 0)
            done = {"id": request["id"], "returncode": os.waitstatus_to_exitcode(status)}
            os.write(replies, (json.dumps(done) + "\n").encode())  # (one short line: one atomic write)
            code = 0
        finally:
            os._exit(code)


# ------------------------------------------------------------------------------------------------ the test side
class _Server:
    """The fork server of this test process, and the replies it sent (by request)."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_server_env
        )
        self.pending = b""
        self.replies: dict[int, dict] = {}
        self.next_id = 0

    def start(self, request: dict) -> int:
        self.next_id += 1
        self.process.stdin.write((json.dumps(dict(request, id=self.next_id)) + "\n").encode())
        self.process.stdin.flush()
        return self.next_id

    def wait_for(self, ids: list[int], key: str, deadline: float | None) -> bool:
        """Read replies until each of ``ids`` has said ``key`` (True), or until ``deadline`` (False)."""
        fd = self.process.stdout.fileno()
        while not all(key in self.replies.get(i, {}) for i in ids):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0 or not select.select([fd], [], [], left)[0]:
                return False
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the launcher's fork server ended")
            self.pending += chunk
            *lines, self.pending = self.pending.split(b"\n")
            for line in lines:
                reply = json.loads(line)
                self.replies.setdefault(reply.pop("id"), {}).update(reply)
        return True


def _fork_server() -> _Server:
    global _server
    if _server is None or _server.process.poll() is not None:
        _server = _Server()
    return _server


def _imported_differently(env: dict[str, str]) -> list[str]:
    keys = {k for k in set(env) | set(_server_env) if k.startswith(READ_AT_IMPORT) and not k.startswith(OWN)}
    return sorted(k for k in keys if env.get(k) != _server_env.get(k))


def _target(command: list[str]) -> tuple[str | None, str | None, list[str]] | None:
    """(script, module, arguments) of ``python SCRIPT ARGS`` or ``python -m MODULE ARGS``; None for any other."""
    if len(command) < 2 or command[0] != sys.executable:
        return None
    if command[1] == "-m" and len(command) > 2:
        return None, command[2], command[3:]
    if command[1].startswith("-"):
        return None  # python -c, or interpreter options: a launch of its own
    return command[1], None, command[2:]


def _forked(commands: list[list[str]], envs: list[dict], cwd, timeout: float) -> list[subprocess.CompletedProcess]:
    """Each command forked from the server at once, each to its end: all of them killed if ``timeout`` passes, and
    (as torchrun does) the others killed 30 s after one has failed."""
    server = _fork_server()
    with tempfile.TemporaryDirectory(prefix="launch-") as tmp:
        ids, files = [], []
        for n, (command, env) in enumerate(zip(commands, envs)):
            script, module, args = _target(command)
            out, err = os.path.join(tmp, f"{n}.out"), os.path.join(tmp, f"{n}.err")
            request = dict(script=script, module=module, args=args, env=env, cwd=str(cwd) if cwd else None)
            ids.append(server.start(dict(request, out=out, err=err)))
            files.append((out, err))
        deadline = time.monotonic() + timeout
        if not server.wait_for(ids, "pid", time.monotonic() + 120):
            raise RuntimeError("the launcher's fork server did not start the processes")
        pids = [server.replies[i]["pid"] for i in ids]
        failed_at = None
        while not server.wait_for(ids, "returncode", min(deadline, time.monotonic() + 1)):
            codes = [server.replies[i].get("returncode") for i in ids]
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = time.monotonic()
            if time.monotonic() >= deadline or (failed_at and time.monotonic() - failed_at > 30):
                for pid, code in zip(pids, codes):
                    if code is None:
                        os.kill(pid, signal.SIGKILL)
                server.wait_for(ids, "returncode", None)
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(commands[0], timeout)
                break
        return [
            subprocess.CompletedProcess(
                command,
                server.replies.pop(i)["returncode"],
                Path(out).read_text(errors="replace"),
                Path(err).read_text(errors="replace"),
            )
            for command, i, (out, err) in zip(commands, ids, files)
        ]


def run(command, *, env: dict[str, str] | None = None, cwd=None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)``, forked from the
    server where ``command`` is ``python SCRIPT ...`` or ``python -m MODULE ...`` and the environment allows."""
    command = [str(c) for c in command]
    env = dict(os.environ if env is None else env)
    with _lock:
        if _target(command) is None or _imported_differently(env):
            return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        return _forked([command], [env], cwd, timeout)[0]


def free_port() -> int:
    """A TCP port of loopback that no process holds now (the OS picks it), so runs in parallel test workers never
    share one."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    command, ranks: int = 2, *, env: dict[str, str] | None = None, cwd=None, timeout: float = 900
) -> list[subprocess.CompletedProcess]:
    """``command`` (``python SCRIPT ...``) as ``ranks`` processes of one ``torch.distributed`` job on this machine, in
    the environment ``torchrun --nproc_per_node RANKS`` gives its ranks (RANK, LOCAL_RANK, WORLD_SIZE, the master's
    address and a free port, one thread each), forked from the server: each rank's result, in rank order. A test of
    what torchrun itself does (its agent, ``--tee``, its exit codes) launches torchrun."""
    command = [str(c) for c in command]
    env = dict(os.environ if env is None else env)
    job = dict(
        WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
    )
    job.update(GROUP_RANK="0", ROLE_WORLD_SIZE=str(ranks), OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    envs = [dict(env, **job, RANK=str(r), LOCAL_RANK=str(r), ROLE_RANK=str(r)) for r in range(ranks)]
    with _lock:
        if _target(command) is None or _imported_differently(envs[0]):
            raise ValueError(f"run_ranks forks python processes in the suite's environment, not {command[:2]}")
        return _forked([command] * ranks, envs, cwd, timeout)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
