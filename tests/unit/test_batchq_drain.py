"""batchq-drain's verdict on a run, from the runner itself (no systemd: it then
writes no journal stream or record it cannot, and looks for no cgroup)."""

import json
import os
import pathlib
import resource
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


@pytest.mark.parametrize("stop, ended", [
    # systemctl stop: SIGTERM to the runner and the batch alike (the unit's cgroup). The run ends with 0, a success
    # (SIGTERM would be a failure of the oneshot unit) that batchq.continue@ does not continue: the drain stays
    # stopped until its timer's next elapse.
    (signal.SIGTERM, 0),
    # a deploy's hand-over: SIGUSR1 to the runner, whose batch then ends as it would (here: it commits and
    # exits 75). BACKLOG_EXIT_CODE, which the unit counts as a success (SuccessExitStatus=) and
    # batchq.continue@ as more work waiting: the next run starts at once.
    (signal.SIGUSR1, 75),
])
def test_a_stop_ends_the_run_stopped_and_a_hand_over_leaves_work_waiting(tmp_path, stop, ended):
    process, started = drain(tmp_path, 75, 60)
    try:
        wait_for(started, process)
        os.kill(process.pid, stop)
        os.kill(only_child(process), signal.SIGTERM)
        assert process.wait(timeout=30) == ended
    finally:
        process.kill()


def only_child(process):
    """The pid of the one batch a runner runs (no batch is made ready ahead before its second)."""
    return int(subprocess.run(["ps", "-o", "pid=", "--ppid", str(process.pid)], check=True,
                              stdout=subprocess.PIPE, text=True).stdout.split()[0])


def runner(tmp_path, args, **popen):
    """The runner, run by hand in tmp_path: no systemd, no journal."""
    env = {key: value for key, value in os.environ.items() if key != "INVOCATION_ID"}
    env.update(popen.pop("env", {}))
    return subprocess.Popen([sys.executable, str(RUNNER)] + args, cwd=tmp_path, env=env, **popen)


def write(folder, name, text):
    (folder / name).write_text(text)
    return str(folder / name)


# A batch that crashes in a folder of its own: its core (core_pattern "core") lands there.
CRASH = ("import os, signal, sys\n"
         "os.chdir(sys.argv[1])\n"
         "os.kill(os.getpid(), signal.SIGSEGV)\n")


@pytest.mark.parametrize("preload", [False, True])
def test_a_crashed_batch_dumps_its_own_core_and_the_runner_none(tmp_path, preload):
    with open("/proc/sys/kernel/core_pattern", encoding="utf-8") as handle:
        if handle.read().strip() != "core":
            pytest.skip("the cores are not files in the crashed process's folder here")
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    if hard == 0:
        pytest.skip("no core may be dumped here")
    crashed = tmp_path / "batch"
    crashed.mkdir()
    script = write(tmp_path, "crash.py", CRASH)
    command = ["--", script, str(crashed)] if preload else ["--", sys.executable, script, str(crashed)]
    process = runner(tmp_path, (["--preload", "json"] if preload else []) + ["75", "0", "0"] + command,
                     preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (hard, hard)))
    try:
        status = os.waitpid(process.pid, 0)[1]
        process.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    finally:
        process.kill()
    # the runner ends by the batch's signal, so that systemd records it, but dumps no core of its own
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV, status
    assert not os.WCOREDUMP(status)
    assert not list(tmp_path.glob("core*"))
    # the batch's core is the batch's, as its limit allows
    assert list(crashed.glob("core*"))


# A module that a consumer preloads, which sets signals up at import as a graceful shutdown does, and
# keeps random generators of its own: the one the drain scenario preloads.
GRACEFUL = (RUNNER.parents[3] / "molecule" / "drain" / "files" / "preloaded" / "graceful.py").read_text()
# The consumer: each batch records what it found, and exits 75 twice, then 0.
REPORT = """import json, os, random, signal, sys
import graceful


def name(handler):
    return handler.name if isinstance(handler, signal.Handlers) else getattr(handler, "__qualname__", repr(handler))


number = int(os.environ["BATCHQ_BATCH"])
found = {
    "batch": number,
    "handlers": {signum.name: name(signal.getsignal(signum)) for signum in (signal.SIGTERM, signal.SIGUSR1,
                                                                            signal.SIGALRM)},
    "mask": sorted(signal.Signals(signum).name for signum in signal.pthread_sigmask(signal.SIG_BLOCK, ())),
    "own": graceful.OWN.random(),
    "global": random.random(),
    "system": graceful.SYSTEM.random(),
}
with open(sys.argv[1], "a", encoding="utf-8") as log:
    log.write(json.dumps(found) + "\\n")
sys.exit(75 if number < 3 else 0)
"""


def batches_of(tmp_path, preload, module="graceful", text=GRACEFUL, script=REPORT, env=None):
    """Run the consumer's drain of three batches, with its module preloaded or imported by each batch;
    returns what each batch recorded."""
    folder = tmp_path / ("preloaded" if preload else "plain")
    folder.mkdir()
    write(folder, module + ".py", text)
    path, log = write(folder, "report.py", script), folder / "batches.jsonl"
    command = ["--", path, str(log)] if preload else ["--", sys.executable, path, str(log)]
    process = runner(folder, (["--preload", module] if preload else []) + ["75", "30000000", "1000000"] + command,
                     env=env or {})
    try:
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_a_preloaded_batch_has_the_signal_handlers_and_mask_its_modules_left(tmp_path):
    plain, preloaded = batches_of(tmp_path, False), batches_of(tmp_path, True)
    # what the module set up, which the comparison below must find
    assert plain[0]["handlers"]["SIGTERM"] == "graceful" and "SIGALRM" in plain[0]["mask"], plain
    assert [b["batch"] for b in preloaded] == [b["batch"] for b in plain] == [1, 2, 3]
    for alone, forked in zip(plain, preloaded):
        # none of the runner's own handling (its SIGUSR1 and SIGALRM handlers, SIGTERM while it preloads)
        assert (forked["handlers"], forked["mask"]) == (alone["handlers"], alone["mask"]), (plain, preloaded)


def test_a_preloaded_batch_draws_its_own_random_numbers(tmp_path):
    preloaded = batches_of(tmp_path, True)
    for generator in ("own", "global", "system"):
        assert len({b[generator] for b in preloaded}) == len(preloaded) == 3, (generator, preloaded)


NUMPY = """import numpy
GENERATOR = numpy.random.default_rng()
LEGACY = numpy.random.RandomState()
"""
NUMPY_REPORT = """import json, os, sys
import numpy
import drawn

number = int(os.environ["BATCHQ_BATCH"])
found = {"batch": number, "generator": drawn.GENERATOR.random(), "legacy": drawn.LEGACY.random_sample(),
         "global": numpy.random.random()}
with open(sys.argv[1], "a", encoding="utf-8") as log:
    log.write(json.dumps(found) + "\\n")
sys.exit(75 if number < 3 else 0)
"""


def test_a_preloaded_batch_draws_its_own_numpy_random_numbers(tmp_path):
    # numpy is pinned with the test dependencies: its absence is a failure here, not a skip
    # OpenBLAS would start threads at import, which no runner forks
    preloaded = batches_of(tmp_path, True, "drawn", NUMPY, NUMPY_REPORT, env={"OPENBLAS_NUM_THREADS": "1"})
    for generator in ("generator", "legacy", "global"):
        assert len({b[generator] for b in preloaded}) == len(preloaded) == 3, (generator, preloaded)


# A consumer whose first batch works until it is told to stop (SIGTERM: it commits and exits 75), or
# outlives its timeout; any later batch finds the queue empty.
WORKS = """import os, sys, time
import graceful

if os.environ["BATCHQ_BATCH"] != "1":
    sys.exit(0)
open(sys.argv[1], "w").close()
time.sleep(60)
"""


def test_a_module_that_takes_the_runners_signals_leaves_it_its_hand_over_and_timeout(tmp_path):
    # GRACEFUL ignores SIGUSR1 and blocks SIGALRM: the runner still hands over and times out
    folder = tmp_path / "preloaded"
    folder.mkdir()
    write(folder, "graceful.py", GRACEFUL)
    script, started = write(folder, "works.py", WORKS), folder / "started"
    process = runner(folder, ["--preload", "graceful", "75", "60000000", "1000000", "--", script, str(started)])
    try:
        wait_for(started, process)
        os.kill(process.pid, signal.SIGUSR1)
        os.kill(only_child(process), signal.SIGTERM)
        # one batch, then the hand-over: BACKLOG_EXIT_CODE (no second batch, which would end the run with 0)
        assert process.wait(timeout=30) == 75
    finally:
        process.kill()
    started.unlink()
    process = runner(folder, ["--preload", "graceful", "75", "1000000", "1000000", "--", script, str(started)])
    try:
        # the batch's timeout (1 s): SIGTERM, which it answers with 75, and the run fails as a timeout
        assert process.wait(timeout=30) == -signal.SIGTERM
    finally:
        process.kill()
    assert started.exists()


# A consumer whose second batch upgrades the preloaded module (a new file, no deploy) once the runner's look at its
# code is due (once a second); each batch records the module's version it has.
UPGRADES = """import os, sys, time
import mod

number = int(os.environ["BATCHQ_BATCH"])
with open(sys.argv[1], "a", encoding="utf-8") as log:
    log.write("%d %d\\n" % (number, mod.VERSION))
if number == 2:
    time.sleep(1.2)
    with open(mod.__file__, "a", encoding="utf-8") as module:
        module.write("VERSION = 2\\n")
sys.exit(75 if number < 4 else 0)
"""


def test_a_preloading_runner_goes_on_under_the_new_code_once_a_preloaded_file_changed(tmp_path):
    write(tmp_path, "mod.py", "VERSION = 1\n")
    script, log = write(tmp_path, "upgrades.py", UPGRADES), tmp_path / "batches"
    process = runner(tmp_path, ["--preload", "mod", "75", "30000000", "1000000", "--", script, str(log)])
    try:
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
    # the runner imported the module afresh after batch 2, and its batch numbers went on
    assert log.read_text().split("\n") == ["1 1", "2 1", "3 2", "4 2", ""]


@pytest.mark.parametrize("module", ["import socket\nCONNECTION = socket.socket()\n", "raise ImportError('no')\n"])
def test_a_preload_that_a_fork_would_break_or_that_fails_runs_no_batch(tmp_path, module):
    write(tmp_path, "mod.py", module)
    script, log = write(tmp_path, "upgrades.py", UPGRADES), tmp_path / "batches"
    process = runner(tmp_path, ["--preload", "mod", "75", "30000000", "1000000", "--", script, str(log)],
                     stderr=subprocess.DEVNULL)
    try:
        assert process.wait(timeout=60) == 1
    finally:
        process.kill()
    assert not log.exists()
