"""batchq-drain's verdict on a run, from the runner itself (no systemd: it then
writes no journal stream or record it cannot, and looks for no cgroup). The
runner runs from the role's files, and imports its modules from there, as
it does from its folder on the hosts."""

import ast
import glob
import json
import os
import pathlib
import resource
import shutil
import signal
import subprocess
import sys

import pytest
from waiting import wait_for

FILES = pathlib.Path(__file__).resolve().parents[2] / "roles" / "consumer" / "files"
RUNNER = FILES / "batchq-drain"
# A batch that handles SIGTERM as the reference consumer does: it exits CODE, as after a commit.
BATCH = ("import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, lambda *_: sys.exit(int(sys.argv[1])))\n"
         "open(sys.argv[2], 'w').close()\n"
         "time.sleep(60)\n")


UNIT = "batchq-orders@2.service"


def spec(folder, **fields):
    """A runtime spec in folder, as the role writes one (module_utils/consumer_runtime.py), with fields; its path."""
    written = {"spec_version": 1, "consumer": "orders", "services": ["batchq-orders@1.service", UNIT],
               "backlog_exit_code": 75, "timeout_usec": 30000000, "stop_timeout_usec": 1000000,
               "interval_usec": 10000000, "preload": [], "metrics_folder": None, "hooks": None,
               "hook_credentials": None, "running_max": None}
    written.update(fields)
    path = pathlib.Path(folder) / "batchq-orders.json"
    path.write_text(json.dumps(written))
    return str(path)


def runner(folder, command, preload=None, timeout_s=30, stop_timeout_s=1, python=sys.executable, metrics=None,
           **popen):
    """The runner, run by hand in folder (no systemd, no journal): batches of
    command while they exit 75; preload: the modules it imports once;
    metrics: the folder of the consumer's metrics file."""
    env = {key: value for key, value in os.environ.items() if key != "INVOCATION_ID"}
    env.update(popen.pop("env", {}))
    path = spec(folder, preload=list(preload or []), timeout_usec=int(timeout_s * 1e6),
                stop_timeout_usec=int(stop_timeout_s * 1e6), metrics_folder=metrics)
    args = (["--preload"] if preload else []) + ["--spec", path, "--unit", UNIT, "--"] + list(command)
    return subprocess.Popen([python, str(RUNNER)] + args, cwd=folder, env=env, **popen)


def drain(tmp_path, code, timeout_s):
    started = tmp_path / "started"
    process = runner(tmp_path, [sys.executable, "-c", BATCH, str(code), str(started)], timeout_s=timeout_s,
                     stop_timeout_s=10)
    return process, started


def wait_started(path, process):
    """Wait until the batch made path; the runner must not end first."""
    def started():
        assert process.poll() is None, "the runner ended before its batch started"
        return path.exists()
    wait_for(started, 30, "the batch to start")


@pytest.mark.parametrize("code", [0, 75])
def test_a_batch_that_its_timeout_ended_fails_the_run_whatever_it_exits(tmp_path, code):
    process, started = drain(tmp_path, code, 2)
    try:
        assert process.wait(timeout=30) == -signal.SIGTERM
    finally:
        process.kill()
    assert started.exists()


@pytest.mark.parametrize("code", [0, 3, 75])
def test_a_plain_consumer_runs_one_batch_and_ends_with_its_status(tmp_path, code):
    # no backlog_exit_code: a plain consumer that waited for a slot runs here, one batch, timed out by the runner
    count = tmp_path / "batches"
    path = spec(tmp_path, backlog_exit_code=None, runner=True)
    batch = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('x'); sys.exit(%d)" % code, str(count)]
    ended = subprocess.run([sys.executable, str(RUNNER), "--spec", path, "--unit", UNIT, "--"] + batch,
                           cwd=tmp_path, timeout=60, check=False)
    assert (ended.returncode, count.read_text()) == (code, "x")


def test_a_plain_consumers_batch_is_timed_out_by_the_runner(tmp_path):
    started = tmp_path / "started"
    path = spec(tmp_path, backlog_exit_code=None, runner=True, timeout_usec=1000000, stop_timeout_usec=5000000)
    process = subprocess.Popen([sys.executable, str(RUNNER), "--spec", path, "--unit", UNIT, "--", sys.executable,
                                "-c", BATCH, "0", str(started)], cwd=tmp_path)
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
        wait_started(started, process)
        os.kill(process.pid, stop)
        os.kill(only_child(process), signal.SIGTERM)
        assert process.wait(timeout=30) == ended
    finally:
        process.kill()


def only_child(process):
    """The pid of the one batch a runner runs (no batch is made ready ahead before its second)."""
    return int(subprocess.run(["ps", "-o", "pid=", "--ppid", str(process.pid)], check=True,
                              stdout=subprocess.PIPE, text=True).stdout.split()[0])


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
    command = [script, str(crashed)] if preload else [sys.executable, script, str(crashed)]
    process = runner(tmp_path, command, ["json"] if preload else None, timeout_s=0, stop_timeout_s=0,
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
    command = [path, str(log)] if preload else [sys.executable, path, str(log)]
    process = runner(folder, command, [module] if preload else None, env=env or {})
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
    process = runner(folder, [script, str(started)], ["graceful"], timeout_s=60)
    try:
        wait_started(started, process)
        os.kill(process.pid, signal.SIGUSR1)
        os.kill(only_child(process), signal.SIGTERM)
        # one batch, then the hand-over: BACKLOG_EXIT_CODE (no second batch, which would end the run with 0)
        assert process.wait(timeout=30) == 75
    finally:
        process.kill()
    started.unlink()
    process = runner(folder, [script, str(started)], ["graceful"], timeout_s=1)
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
    process = runner(tmp_path, [script, str(log)], ["mod"])
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
    process = runner(tmp_path, [script, str(log)], ["mod"], stderr=subprocess.DEVNULL)
    try:
        assert process.wait(timeout=60) == 1
    finally:
        process.kill()
    assert not log.exists()


# The CPython internals of a preloaded batch (batchq_cpython.py) under each CPython a host or a consumer may run.
# A preloaded module that registers an exit handler (the runner's to run, once), and modules of the consumer's
# own with the names of the runner's: the consumer's, never the runner's, are what its imports find.
HEAVY = """import atexit, json, os
import batchq_journal, consumer_protocol


def said(event):
    with open(os.environ["WORK_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"event": event, "pid": os.getpid()}) + "\\n")


atexit.register(said, "preload-atexit")
"""
# A consumer run as `python3 -m work`: a thread and an executor's work that outlive its main code, an exit handler,
# and an uncaught exception in batch 3.
WORK = """import atexit, concurrent.futures, json, os, sys, threading, time
import batchq_journal, consumer_protocol, heavy

NUMBER = int(os.environ["BATCHQ_BATCH"])
DONE = threading.Event()


def said(event, **fields):
    with open(os.environ["WORK_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(dict(fields, event=event, batch=NUMBER)) + "\\n")


def after_main(event):
    # the main code has ended before this says so: only the exit's wait for it lets it
    DONE.wait(30)
    time.sleep(0.1)
    said(event)


said("start", argv=sys.argv, name=__name__, main=sys.modules["__main__"].__dict__ is globals(), path=sys.path,
     own=[batchq_journal.OWN, consumer_protocol.OWN],
     runners=sorted(name for name, module in sys.modules.items()
                    if os.path.dirname(str(getattr(module, "__file__", ""))) == os.environ["RUNNER_FOLDER"]))
threading.Thread(target=after_main, args=("thread",)).start()
concurrent.futures.ThreadPoolExecutor(1).submit(after_main, "executor")
atexit.register(said, "atexit")
DONE.set()
if NUMBER == 3:
    raise RuntimeError("batch 3 raises")
sys.exit(75)
"""


def pythons():
    """Each CPython from 3.9 to 3.14 as a test parameter: the tests' own, or one below ~/.pyenv or on PATH (not
    pyenv's shims, which run only the version pyenv selects)."""
    found = {"%d.%d" % sys.version_info[:2]: sys.executable}
    for minor in range(9, 15):
        version = "3.%d" % minor
        candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/%s.*/bin/python%s" % (version, version))))
        candidates.append(shutil.which("python" + version))
        found.setdefault(version, next((path for path in candidates if path and "/shims/" not in path), None))
    return [pytest.param(version, python, id=version) for version, python in sorted(
        found.items(), key=lambda item: int(item[0].split(".")[1]))]


def events(log, batch):
    return [record for record in log if record.get("batch") == batch]


@pytest.mark.parametrize("version, python", pythons())
def test_a_preloaded_batch_starts_and_ends_as_python3_m_would_under_each_python(tmp_path, version, python):
    if python is None:
        pytest.skip("no Python %s here: the drain scenario runs Debian's (3.9, 3.11, 3.13, 3.14)" % version)
    write(tmp_path, "heavy.py", HEAVY)
    write(tmp_path, "work.py", WORK)
    for name in ("batchq_journal.py", "consumer_protocol.py"):
        write(tmp_path, name, "OWN = %r\n" % "the consumer's")
    env = {"RUNNER_FOLDER": str(FILES)}
    # what python3 itself does, batch by batch
    plain_log, plain_errors = tmp_path / "plain.jsonl", []
    for number in (1, 2, 3):
        ended = subprocess.run([python, "-m", "work"], cwd=tmp_path, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
                               env=dict(os.environ, WORK_LOG=str(plain_log), BATCHQ_BATCH=str(number), **env))
        assert ended.returncode == (1 if number == 3 else 75), ended.stderr
        plain_errors.append(ended.stderr)
    preloaded_log = tmp_path / "preloaded.jsonl"
    process = runner(tmp_path, ["-m", "work"], ["heavy"], python=python, stderr=subprocess.PIPE, text=True,
                     env=dict(env, WORK_LOG=str(preloaded_log)))
    try:
        _out, said = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 1, said
    plain = [json.loads(line) for line in plain_log.read_text().splitlines()]
    preloaded = [json.loads(line) for line in preloaded_log.read_text().splitlines()]
    for number in (1, 2, 3):
        alone, forked = events(plain, number), events(preloaded, number)
        # argv, __main__, sys.path and the modules found as python3 -m has them; none of the runner's
        assert forked[0] == alone[0], (alone, forked)
        assert alone[0]["own"] == ["the consumer's"] * 2 and alone[0]["runners"] == [], alone
        # the thread and the executor's work finish after the main code, then the exit handler runs
        assert sorted(e["event"] for e in forked) == sorted(e["event"] for e in alone) == [
            "atexit", "executor", "start", "thread"], (alone, forked)
        assert forked[-1]["event"] == alone[-1]["event"] == "atexit", (alone, forked)
    # the preload's exit handler runs once, in the runner, and in no batch
    assert [(e["event"], e["pid"]) for e in preloaded if "batch" not in e] == [("preload-atexit", process.pid)]
    # the uncaught exception: python3's traceback, runpy's frames and all, none of the runner's
    traceback = plain_errors[2].splitlines()
    assert traceback[0] == "Traceback (most recent call last):" and traceback[-1] == "RuntimeError: batch 3 raises"
    lines = said.splitlines()
    start = lines.index(traceback[0])
    assert lines[start:start + len(traceback)] == traceback, said


def runner_files():
    """The runner and its modules: the role's files that batchq-drain imports, found by their imports."""
    files, todo = {}, ["batchq-drain"]
    while todo:
        name = todo.pop()
        files[name] = tree = ast.parse((FILES / name).read_text(), name)
        for node in ast.walk(tree):
            imported = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [
                node.module] if isinstance(node, ast.ImportFrom) else []
            imported += [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                         ] if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "import_beside" else []
            todo += [module + ".py" for module in imported
                     if (FILES / (module + ".py")).exists() and module + ".py" not in files]
    return files


def test_the_runner_is_modules_of_one_job_each_that_a_reader_can_hold_in_mind():
    files = runner_files()
    # the modules it imports beside it, found from its own import statements
    assert {"batchq_journal.py", "batchq_supervise.py", "batchq_preload.py", "batchq_cpython.py"} <= set(files)
    for name, tree in files.items():
        lines = (FILES / name).read_text().count("\n")
        assert lines <= 400, "%s has %d lines" % (name, lines)
        assert ast.get_docstring(tree), "%s says not what it does" % name


def test_the_cpython_internals_are_in_one_module():
    """A private name of another module (module._name) only in batchq_cpython.py; os._exit() is public."""
    used = {}
    for name, tree in runner_files().items():
        modules = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names}
        used[name] = sorted("%s.%s" % (node.value.id, node.attr) for node in ast.walk(tree)
                            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                            and node.value.id in modules and node.attr.startswith("_")
                            and not node.attr.startswith("__") and (node.value.id, node.attr) != ("os", "_exit"))
    internal = used.pop("batchq_cpython.py")
    assert internal, "what finds them found none"
    assert not any(used.values()), used


def test_the_runner_writes_each_batchs_metrics_into_the_specs_folder_for_its_unit(tmp_path):
    folder = tmp_path / "batchq-orders.d"
    folder.mkdir()
    # a series of an instance the consumer no longer has (not among the spec's services)
    (folder / "metrics.prom").write_text('batchq_consumer_runs_total{consumer="orders",unit="batchq-orders@3.service",'
                                         'result="success"} 4\n')
    # batches 1 and 2 leave work waiting, batch 3 ends by SIGTERM
    batch = "import os, signal; n = int(os.environ['BATCHQ_BATCH']); n < 3 or os.kill(os.getpid(), signal.SIGTERM)" \
            "; raise SystemExit(75)"
    process = runner(tmp_path, [sys.executable, "-c", batch], metrics=str(folder))
    try:
        assert process.wait(timeout=60) == -signal.SIGTERM
    finally:
        process.kill()
    labels = 'consumer="orders",unit="%s"' % UNIT
    series = (folder / "metrics.prom").read_text().splitlines()
    for line in ('batchq_consumer_runs_total{%s,result="backlog"} 2' % labels,
                 'batchq_consumer_runs_total{%s,result="signal"} 1' % labels,
                 'batchq_consumer_last_exit_status{%s} %d' % (labels, 128 + signal.SIGTERM),
                 'batchq_consumer_interval_seconds{%s} 10' % labels,
                 'batchq_consumer_timeout_seconds{%s} 30' % labels):
        assert line in series, series
    assert not [line for line in series if "@3" in line], series


@pytest.mark.parametrize("field, value, said", [
    (None, None, "cannot be read"),
    ("timeout_usec", "5min", "field timeout_usec"),
    ("preload", [], "field preload"),
    ("backlog_exit_code", None, "field backlog_exit_code"),
    ("backlog_exit_code", 0, "field backlog_exit_code"),
    ("spec_version", 2, "spec_version"),
])
def test_a_missing_or_bad_spec_runs_no_batch_and_says_which_file_and_field(tmp_path, field, value, said):
    path = spec(tmp_path, preload=["json"])
    if field is None:
        os.unlink(path)
    else:
        spec(tmp_path, **dict({"preload": ["json"]}, **{field: value}))
    batch = [sys.executable, "-c", "open('ran', 'w').close()"]
    ended = subprocess.run([sys.executable, str(RUNNER), "--preload", "--spec", path, "--unit", UNIT, "--"] + batch,
                           cwd=tmp_path, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert ended.returncode == 2
    assert ended.stderr.count("\n") == 1 and path in ended.stderr and said in ended.stderr, ended.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("args", [
    ["75", "0", "30000000", "--", "/bin/true"],  # the positional command line of old
    ["--spec", "SPEC", "--", "/bin/true"],
    ["--unit", UNIT, "--", "/bin/true"],
    ["--spec", "SPEC", "--unit", UNIT, "--"],
    ["--spec", "SPEC", "--unit", UNIT, "/bin/true"],
    ["--preload", "json", "--spec", "SPEC", "--unit", UNIT, "--", "/bin/true"],
    ["--preload", "--spec", "SPEC", "--unit", UNIT, "--", "-m"],
])
def test_a_command_line_off_the_usage_runs_no_batch(tmp_path, args):
    path = spec(tmp_path, preload=["json"])
    ended = subprocess.run([sys.executable, str(RUNNER)] + [path if arg == "SPEC" else arg for arg in args],
                           cwd=tmp_path, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert ended.returncode == 2
    assert ended.stderr.startswith("Usage (from the unit's ExecStart=):\n    batchq-drain [--preload] --spec"), ended.stderr
