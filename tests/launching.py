"""Run a multi-process launch (``torchrun``, ``accelerate launch``) from a test and leave no process behind.

torchrun starts each rank in a session of its own, so killing the launcher (what
``subprocess.run(..., timeout=...)`` does) orphans the ranks: one stuck rank once outlived its
test by 50 minutes. :func:`run_launch` marks the launch's environment with a fresh id that
every descendant inherits (``SERA_LAUNCH_ID``), and afterwards finds every process that still
carries it, whether the launch ended or timed out:

* on timeout, every marked process is killed (SIGKILL) and the test fails, naming them;
* after a launch that ended on its own, a marked process still alive is a rank that outlived
  its run: it is killed and the test fails, naming it (whatever the launch's exit code).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

MARK = "SERA_LAUNCH_ID"


def marked(launch_id: str) -> dict[int, str]:
    """``{pid: command line}`` of the live processes whose environment holds ``SERA_LAUNCH_ID=launch_id``."""
    needle = f"{MARK}={launch_id}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _kill(pids: dict[int, str]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_launch(cmd: list[str], *, env: dict[str, str], timeout: float, cwd: str | os.PathLike | None = None,
               grace: float = 10.0) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end (at most ``timeout`` seconds) and check that none of its processes
    outlives it (module docstring); ``grace``: seconds a rank may take to exit after the launcher."""
    launch_id = uuid.uuid4().hex
    proc = subprocess.Popen(cmd, env={**env, MARK: launch_id}, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        left = marked(launch_id)
        _kill(left)
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the launch ran past {timeout} s; killed {len(left)} process(es): "
                             f"{sorted(left.values())}\n{err[-3000:]}") from None
    deadline = time.monotonic() + grace
    while (left := marked(launch_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        _kill(left)
        raise AssertionError(f"{len(left)} process(es) outlived the launch (exit {proc.returncode}), killed: "
                             f"{sorted(left.values())}\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
