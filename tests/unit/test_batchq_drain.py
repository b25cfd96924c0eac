"""batchq-drain's verdict on a run, from the runner itself (no systemd: it then
writes no journal stream or record it cannot, and looks for no cgroup)."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

RUNNER = pathlib.Path(__file__).resolve().parents[2] / "roles" / "consumer" / "files" / "batchq-drain"
# A batch that handles SIGTERM as the reference consumer does: it exits CODE, as after a commit.
BATCH = ("import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, lambda *_: sys.exit(int(sys.argv[1])))\n"
         "open(sys.argv[2], 'w').close()\n"
         "time.sleep(60)\n")


def drain(tmp_path, code, timeout_s):
    started = tmp_path / "started"
    env = {key: value for key, value in os.environ.items() if key != "INVOCATION_ID"}
    process = subprocess.Popen([sys.executable, str(RUNNER), "75", str(int(timeout_s * 1e6)), "10000000", "--",
                                sys.executable, "-c", BATCH, str(code), str(started)], env=env)
    return process, started


def wait_for(path, process):
    deadline = time.monotonic() + 30
    while not path.exists():
        assert process.poll() is None and time.monotonic() < deadline, "the batch never started"
        time.sleep(0.05)


@pytest.mark.parametrize("code", [0, 75])
def test_a_batch_that_its_timeout_ended_fails_the_run_whatever_it_exits(tmp_path, code):
    process, started = drain(tmp_path, code, 2)
    try:
        assert process.wait(timeout=30) == -signal.SIGTERM
    finally:
        process.kill()
    assert started.exists()


def test_a_stop_that_a_batch_answers_with_more_work_waits_is_a_success(tmp_path):
    # systemctl stop: SIGTERM to the runner and the batch alike (the unit's cgroup)
    process, started = drain(tmp_path, 75, 60)
    try:
        wait_for(started, process)
        batch = int(subprocess.run(["ps", "-o", "pid=", "--ppid", str(process.pid)], check=True,
                                   stdout=subprocess.PIPE, text=True).stdout.split()[0])
        os.kill(process.pid, signal.SIGTERM)
        os.kill(batch, signal.SIGTERM)
        # BACKLOG_EXIT_CODE, which the unit counts as a success (SuccessExitStatus=)
        # and batchq.continue@ as more work waiting
        assert process.wait(timeout=30) == 75
    finally:
        process.kill()
