"""The output-folder lock: a stale lock is taken over by exactly one of the processes that find it, a pid given later
to an unrelated process does not keep a lock alive, and the refusal names the lock file and its holder (issue 30,
locks)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf_cocodr.rundir import locks
from hf_cocodr.rundir.run_record import LOCK, RunFolder, RunLockedError, acquire_lock, release_lock

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="pid start times are read from /proc (Linux)")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _start_ticks(pid: int) -> int:
    """Field 22 of ``/proc/<pid>/stat``: when the process started, in clock ticks since boot."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _stale_lock(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK).write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "started": "earlier"}))


def _racer(folder: str, start, done, results) -> None:
    """One process of the race: wait for the others, try to take the lock, report, and stay alive (holding what it
    took) until every racer has tried."""
    real = locks._pid_alive

    def slow_pid_alive(pid: int) -> bool:  # a liveness check that takes a while (a loaded machine)
        time.sleep(0.05)
        return real(pid)

    locks._pid_alive = slow_pid_alive
    logging.disable(logging.CRITICAL)
    start.wait()
    try:
        acquire_lock(folder)
        results.put(("won", os.getpid()))
    except RunLockedError:
        results.put(("locked", os.getpid()))
    except Exception as e:  # noqa: BLE001 - any other outcome fails the test below
        results.put((f"{type(e).__name__}: {e}", os.getpid()))
    done.wait()


def test_processes_starting_on_one_stale_lock_have_exactly_one_winner(tmp_path):
    ctx = multiprocessing.get_context("fork")
    n = 8
    for trial in range(3):
        folder = tmp_path / f"out{trial}"
        _stale_lock(folder)
        start, done, results = ctx.Barrier(n), ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_racer, args=(str(folder), start, done, results)) for _ in range(n)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=60) for _ in range(n)]
        holder = json.loads((folder / LOCK).read_text())["pid"]  # read while every racer is still alive
        for p in procs:
            p.join(timeout=60)
        assert sorted(what for what, _ in outcomes) == ["locked"] * (n - 1) + ["won"], outcomes
        winner = next(pid for what, pid in outcomes if what == "won")
        assert holder == winner


@pytest.fixture()
def live_stranger():
    """A live process that is not hf-cocodr (it may have been given the pid of a writer that died)."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_pid_now_held_by_an_unrelated_process_is_a_stale_lock(tmp_path, live_stranger, caplog):
    out = tmp_path / "out"
    out.mkdir()
    start = _start_ticks(live_stranger)
    # the writer that took this lock had the pid before the stranger: it started at another time
    (out / LOCK).write_text(
        json.dumps(
            {
                "pid": live_stranger,
                "host": socket.gethostname(),
                "started": "earlier",
                "boot_id": _boot_id(),
                "pid_start": start - 1,
            }
        )
    )
    with caplog.at_level(logging.WARNING, logger="hf_cocodr"):
        run = RunFolder.claim(out, "finetune", {"a": 1})
    assert any(
        "now belongs to another process" in r.getMessage() and str(out / LOCK) in r.getMessage()
        for r in caplog.records
    )
    assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    run.release()
    assert not (out / LOCK).exists()
    # a lock of an earlier version (pid and start only), written an hour before the process now under its pid began
    (out / LOCK).write_text(json.dumps({"pid": live_stranger, "host": socket.gethostname(), "started": "earlier"}))
    os.utime(out / LOCK, (time.time() - 3600, time.time() - 3600))
    acquire_lock(out)
    assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    release_lock(out)
    # a lock taken before this machine restarted is stale whatever runs under its pid now
    (out / LOCK).write_text(
        json.dumps(
            {
                "pid": live_stranger,
                "host": socket.gethostname(),
                "started": "earlier",
                "boot_id": "an-earlier-boot",
                "pid_start": start,
            }
        )
    )
    acquire_lock(out)
    assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    release_lock(out)


def test_a_live_holder_is_refused_with_the_lock_file_and_its_pid(tmp_path, live_stranger):
    out = tmp_path / "out"
    out.mkdir()
    lock = {
        "pid": live_stranger,
        "host": socket.gethostname(),
        "started": "now",
        "boot_id": _boot_id(),
        "pid_start": _start_ticks(live_stranger),
    }
    (out / LOCK).write_text(json.dumps(lock))
    with pytest.raises(RunLockedError) as err:
        RunFolder.claim(out, "finetune", {"a": 1})
    message = str(err.value)
    assert str(out / LOCK) in message and f"pid {live_stranger}" in message and "\n" not in message
    assert json.loads((out / LOCK).read_text()) == lock  # refused: the holder's lock is untouched


def test_a_lock_taken_by_this_version_records_the_process_start(tmp_path):
    path = acquire_lock(tmp_path)
    rec = json.loads(path.read_text())
    assert rec["pid"] == os.getpid() and rec["pid_start"] == _start_ticks(os.getpid())
    assert rec["boot_id"] == _boot_id()
    assert [p.name for p in tmp_path.iterdir()] == [LOCK]  # the staging file is gone
    release_lock(tmp_path)
    assert list(tmp_path.iterdir()) == []
