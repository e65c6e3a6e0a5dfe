"""The suite's launcher (``tests/launcher.py``) gives what a launched ``python`` gives: the same output, exit status,
death by signal, environment, working folder and temporary folder; and two ranks in torchrun's environment."""

from __future__ import annotations

import os
import subprocess
import sys

import launcher

SCRIPT = """
import json, os, sys, tempfile
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "mine": os.environ.get("MY_SETTING"),
                  "tmp": tempfile.gettempdir(), "rank": os.environ.get("RANK"), "world": os.environ.get("WORLD_SIZE"),
                  "path0": sys.path[0]}))
print("to stderr", file=sys.stderr)
if sys.argv[1:] == ["die"]:
    import signal
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
"""


def _both(script, args, env, cwd):
    forked = launcher.run([sys.executable, script, *args], env=env, cwd=cwd)
    launched = subprocess.run([sys.executable, script, *args], env=env, cwd=cwd, capture_output=True, text=True)
    return forked, launched


def test_a_forked_process_is_what_a_launched_one_is(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "work").mkdir()
    env = dict(os.environ, MY_SETTING="seven", TMPDIR=str(tmp_path / "tmp"))
    for args in (["3", "x y"], ["die"], []):
        forked, launched = _both(script, args, env, tmp_path / "work")
        assert (forked.returncode, forked.stdout, forked.stderr) == (
            launched.returncode,
            launched.stdout,
            launched.stderr,
        ), args
    assert forked.returncode == 0 and '"mine": "seven"' in forked.stdout
    assert _both(script, ["die"], env, None)[0].returncode == -9


def test_an_environment_read_at_import_is_launched_not_forked():
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9")
    assert launcher._imported_differently(env) == ["HF_ENDPOINT"]
    assert launcher._imported_differently(dict(os.environ, HF_COCODR_CACHE="/elsewhere")) == []
    assert launcher._target([sys.executable, "-c", "pass"]) is None  # python -c: launched
    assert launcher._target([sys.executable, "-m", "hf_cocodr", "x"]) == (None, "hf_cocodr", ["x"])


def test_ranks_run_at_once_in_torchruns_environment(tmp_path):
    script = tmp_path / "rank.py"
    # each rank waits for the other's file: the two must run at the same time
    script.write_text(
        "import os, sys, time, pathlib\n"
        "d = pathlib.Path(sys.argv[1]); r = int(os.environ['RANK'])\n"
        "(d / f'{r}').write_text(os.environ['WORLD_SIZE'] + ' ' + os.environ['LOCAL_RANK'])\n"
        "t = time.time()\n"
        "while not (d / f'{1 - r}').exists():\n"
        "    time.sleep(0.05)\n"
        "    if time.time() - t > 60: sys.exit(5)\n"
        "print(r)\n"
    )
    ranks = launcher.run_ranks([sys.executable, script, tmp_path], 2)
    assert [(p.returncode, p.stdout) for p in ranks] == [(0, "0\n"), (0, "1\n")]
    assert (tmp_path / "0").read_text() == "2 0" and (tmp_path / "1").read_text() == "2 1"
