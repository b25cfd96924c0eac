"""The contract library against its in-memory backend: options, exit codes,
failures confined to their job, attempts, backoff, dead jobs, results once."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import batchq_queue
import drain_runner
from batchq_queue import MemoryBackend
from conftest import alive, parsed_options
from waiting import wait_for


@pytest.fixture(autouse=True)
def sigterm_handler_restored():
    """main() installs its SIGTERM handler: the next test gets pytest's back."""
    old = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, old)
    batchq_queue.TERM["asked"] = False


def options(**changes):
    return parsed_options(dict(backoff_min=0.0, backoff_max=0.0, job_timeout=5.0), changes)


def run(backend, process, **changes):
    return batchq_queue.run_batch(backend, process, options(**changes))


def states(backend):
    return [job["state"] for _key, job in sorted(backend.jobs.items())]


def ok(job):
    return {"n": job.payload}


@pytest.mark.parametrize("argv, option", [
    (["--limit", "0"], "--limit"),
    (["--max-attempts", "0"], "--max-attempts"),
    (["--max-attempts", "1001"], "--max-attempts"),
    (["--backoff-min", "nan"], "--backoff-min"),
    (["--backoff-max", "inf"], "--backoff-max"),
    (["--backoff-min", "5", "--backoff-max", "1"], "--backoff-max"),
    (["--job-timeout", "0"], "--job-timeout"),
    (["--max-seconds", "-1"], "--max-seconds"),
    (["--backlog-exit-code", "1"], "--backlog-exit-code"),
    (["--work-ms", "nan"], "--work-ms"),
])
def test_a_bad_option_exits_2_naming_it_before_any_claim(argv, option, capsys):
    made = []
    with pytest.raises(SystemExit) as ended:
        batchq_queue.main(argv, ok, make_backend=made.append)
    assert ended.value.code == 2
    assert option in capsys.readouterr().err
    assert made == []


def test_exit_codes():
    assert batchq_queue.exit_code(0, 0, 0, [], False, 75) == 0
    assert batchq_queue.exit_code(3, 0, 3, [], True, 75) == 1  # an outage is a failure, not a backlog
    assert batchq_queue.exit_code(3, 1, 2, [], True, 75) == 75
    assert batchq_queue.exit_code(3, 3, 0, [], False, 75) == 0
    assert batchq_queue.exit_code(3, 3, 0, ["x"], True, 75) == 1


def test_a_full_batch_then_the_rest():
    backend = MemoryBackend(range(5))
    assert run(backend, ok, limit=3) == 75
    assert run(backend, ok, limit=3) == 0
    assert states(backend) == ["done"] * 5
    assert all(len(job["results"]) == 1 for job in backend.jobs.values())
    assert run(backend, ok, limit=3) == 0  # empty


def crash(job):
    if job.payload == "segv":
        import faulthandler
        import resource
        faulthandler.disable()  # a stand-in crash: no stack dump, no core file
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), signal.SIGSEGV)
    if job.payload == "exit":
        sys.exit(3)
    if job.payload == "_exit":
        os._exit(0)
    if job.payload == "hang":
        time.sleep(60)
    if job.payload == "nul":
        raise RuntimeError("a NUL \x00 and a lone \udcff surrogate")
    if job.payload == "huge":
        raise RuntimeError("x" * (1 << 20))
    if job.payload == "set":
        return {1, 2}
    if job.payload == "nan":
        return float("nan")
    if job.payload == "interrupt":
        raise KeyboardInterrupt()
    return ok(job)


def test_each_failure_is_its_jobs_alone():
    payloads = ["segv", "a", "exit", "_exit", "hang", "nul", "huge", "set", "nan", "interrupt", "b"]
    backend = MemoryBackend(payloads)
    started = time.monotonic()
    assert run(backend, crash, job_timeout=1.0, max_attempts=1) == 0
    assert time.monotonic() - started < 20
    assert states(backend) == ["dead", "done", "dead", "dead", "dead", "dead", "dead", "dead", "dead", "dead", "done"]
    errors = {job["payload"]: job["error"] for job in backend.jobs.values()}
    assert "SIGSEGV" in errors["segv"]
    assert "SystemExit" in errors["exit"]
    assert "status 0" in errors["_exit"]
    assert "--job-timeout" in errors["hang"]
    assert "\\x00" in errors["nul"] and "\\udcff" in errors["nul"] and "\x00" not in errors["nul"]
    assert len(errors["huge"]) == batchq_queue.ERROR_CHARS
    assert "TypeError" in errors["set"] and "ValueError" in errors["nan"]
    for error in errors.values():
        if error:
            error.encode("utf-8")  # every text is clean UTF-8


def test_a_helper_that_outlives_its_job_does_not_fail_it():
    backend = MemoryBackend(["a"])

    def helper(job):
        if os.fork() == 0:
            time.sleep(30)  # holds the report pipe open
            os._exit(0)
        return ok(job)

    started = time.monotonic()
    assert run(backend, helper, job_timeout=3.0) == 0
    assert states(backend) == ["done"] and time.monotonic() - started < 2.5


def test_a_jobs_process_dies_with_its_batch(tmp_path):
    """A drain's runner kills a batch that outlasts its timeout by the batch's
    process group. The job's process leads a group of its own: it must die
    too, not run on beside the next batch."""
    noted = tmp_path / "job.pid"

    def hang(job):
        noted.write_text(str(os.getpid()))
        time.sleep(120)

    batch = os.fork()
    if batch == 0:  # the batch, in a process group of its own as the runner starts it
        os.setpgid(0, 0)
        try:
            run(MemoryBackend(["a"]), hang, job_timeout=600.0)
        finally:
            os._exit(0)
    try:
        job = int(wait_for(lambda: noted.exists() and noted.read_text(), 30, "the job to note its pid"))
        assert alive(job)
        os.killpg(batch, signal.SIGKILL)
        os.waitpid(batch, 0)
        wait_for(lambda: not alive(job), 10, "the job's process %d to die with its batch" % job)
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.killpg(batch, signal.SIGKILL)
            os.waitpid(batch, 0)


@pytest.mark.parametrize("character", ["\\", '"'])
def test_a_result_under_the_limit_is_done_whatever_its_characters(character):
    backend = MemoryBackend(["a"])
    result = character * ((batchq_queue.RESULT_BYTES - 2) // 2)  # its JSON text: just under the limit
    assert run(backend, lambda job: result) == 0
    assert states(backend) == ["done"] and backend.jobs[0]["results"][0] == '"%s"' % (("\\" + character) * len(result))


def test_clean_text_cleans_once():
    text = batchq_queue.clean_text("\x00" * 5000)
    assert batchq_queue.clean_text(text) == text
    assert len(text) == batchq_queue.ERROR_CHARS


def test_clean_text_escapes_what_sqs_refuses_and_keeps_the_rest():
    odd = "".join(map(chr, range(32))) + "\x7f\ud800\ufffe\uffff\U0001f600"
    text = batchq_queue.clean_text(odd)
    assert text == ("\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07\\x08\t\n\\x0b\\x0c\r"
                    + "".join("\\x%02x" % code for code in range(14, 32))
                    + "\x7f\\ud800\\ufffe\\uffff\U0001f600")
    assert batchq_queue.clean_text(text) == text


def test_dead_after_exactly_max_attempts_and_the_rest_unharmed():
    backend = MemoryBackend(["nul", "a", "b"])
    codes = [run(backend, crash, max_attempts=3) for _round in range(4)]
    assert states(backend) == ["dead", "done", "done"]
    assert backend.jobs[0]["attempts"] == 3
    assert codes == [75, 1, 1, 0]  # job 0 is due again at once: backoff 0


def test_all_failing_is_exit_1_not_a_backlog():
    backend = MemoryBackend(["nul"] * 3)
    assert run(backend, crash, limit=3, max_attempts=5) == 1


def test_a_job_over_its_attempts_is_dead_before_any_work():
    backend = MemoryBackend(["a"])
    backend.jobs[0]["attempts"] = 3  # three batches died in its work
    ran = []
    assert run(backend, lambda job: ran.append(job) or 1, max_attempts=3) == 1
    assert states(backend) == ["dead"] and ran == []


def test_a_result_already_applied_is_not_applied_again():
    backend = MemoryBackend(["a"])
    backend.jobs[0]["results"].append('"first"')
    assert run(backend, ok) == 0
    assert backend.jobs[0]["results"] == ['"first"']


def test_a_result_already_applied_wins_over_attempts_run_out():
    backend = MemoryBackend(["a"])
    backend.jobs[0]["results"].append('"first"')
    backend.jobs[0]["attempts"] = 3  # its result was stored, but the batch died before the delete
    assert run(backend, ok, max_attempts=3) == 0
    assert states(backend) == ["done"] and backend.jobs[0]["results"] == ['"first"']


def test_backoff_doubles_with_jitter_and_never_overflows():
    low = [batchq_queue.backoff(n, 10, 3600, lambda a, b: a) for n in (1, 2, 3, 100, 10 ** 9)]
    high = [batchq_queue.backoff(n, 10, 3600, lambda a, b: b) for n in (1, 2, 3, 100, 10 ** 9)]
    assert low == [5, 10, 20, 1800, 1800]
    assert high == [10, 20, 40, 3600, 3600]


def test_a_failed_job_waits_its_backoff():
    clock = [0.0]
    backend = MemoryBackend(["nul"], now=lambda: clock[0])
    assert run(backend, crash, backoff_min=10.0, backoff_max=10.0) == 1
    assert 5 <= backend.jobs[0]["due"] <= 10
    assert run(backend, crash) == 0 and backend.jobs[0]["attempts"] == 1  # not due: nothing claimed
    clock[0] = 10.0
    assert run(backend, crash) == 1 and backend.jobs[0]["attempts"] == 2


class StoppedAtFirstDone(MemoryBackend):
    """systemd's stop arrives while the first job's outcome is recorded."""

    def done(self, job, result):
        super().done(job, result)
        if job.id == 0:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_releases_the_jobs_not_started():
    backend = StoppedAtFirstDone(["a", "b", "c"])
    old = signal.signal(signal.SIGTERM, batchq_queue.on_sigterm)
    try:
        assert run(backend, ok) == 75
    finally:
        signal.signal(signal.SIGTERM, old)
        batchq_queue.TERM["asked"] = False
    assert states(backend) == ["done", "ready", "ready"]
    assert [job["attempts"] for job in backend.jobs.values()] == [1, 1, 1]


def test_a_stop_before_the_claim_claims_nothing(capsys):
    backend = MemoryBackend(["a"])
    batchq_queue.TERM["asked"] = True
    assert run(backend, ok) == 0
    assert backend.calls == [] and states(backend) == ["ready"]
    assert "stopped before the claim" in capsys.readouterr().err


def batch_in_its_own_group(backend, process, states_file, **changes):
    """Fork a batch as a drain's runner starts one: a process group of its own, main()'s
    SIGTERM handler. It writes its exit code and the jobs' states to states_file."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)
            signal.signal(signal.SIGTERM, batchq_queue.on_sigterm)
            code = run(backend, process, **changes)
            states_file.write_text(json.dumps({"code": code, "jobs": list(backend.jobs.values())}))
        finally:
            os._exit(code)
    return pid


def test_a_stop_of_the_batch_reaches_the_job_at_work(tmp_path):
    """A drain's runner ends a batch that outlasts its timeout with SIGTERM to the
    batch's process group. The job at work must get it too, so that the batch ends
    at once and gives the job back, rather than wait for the job's own end."""
    noted = tmp_path / "job.pid"
    ended = tmp_path / "states.json"

    def long_job(job):
        noted.write_text(str(os.getpid()))
        time.sleep(60)
        return ok(job)

    batch = batch_in_its_own_group(MemoryBackend(["a", "b"]), long_job, ended, job_timeout=600.0)
    try:
        wait_for(lambda: noted.exists() and noted.read_text(), 30, "the job started")
        os.killpg(batch, signal.SIGTERM)
        stopped = time.monotonic()
        wait_for(lambda: os.waitpid(batch, os.WNOHANG)[0] == batch, 10, "the batch ended after its SIGTERM")
        assert time.monotonic() - stopped < 10
        assert not alive(int(noted.read_text())), "the job's process outlived its batch"
        report = json.loads(ended.read_text())
        assert [job["state"] for job in report["jobs"]] == ["ready", "ready"]  # given back, not failed
        assert [job["error"] for job in report["jobs"]] == [None, None]
        assert report["code"] == 0
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.killpg(batch, signal.SIGKILL)
            os.waitpid(batch, 0)


class LosesTheQueueAtFirstDone(MemoryBackend):
    """The queue's connection is lost while the first job's outcome is recorded."""

    def done(self, job, result):
        raise batchq_queue.QueueError("server closed the connection unexpectedly")

    def start(self, job):
        self.calls.append("start %s" % job.id)


def test_a_queue_lost_starts_no_more_jobs(capsys):
    backend = LosesTheQueueAtFirstDone(["a", "b", "c"])
    assert run(backend, ok) == 1
    assert [call for call in backend.calls if call.startswith("start")] == ["start 0"]
    assert states(backend) == ["claimed", "ready", "ready"]  # the first's outcome is unknown to the queue
    err = capsys.readouterr().err
    assert "the queue failed: done: server closed the connection unexpectedly" in err
    assert '"done": 0' in err


def test_a_batch_runs_its_jobs_in_one_worker_and_a_new_one_after_a_crash():
    backend = MemoryBackend(["a", "b", "segv", "c", "exit", "d"])

    def pid_of(job):
        if job.payload in ("segv", "exit"):
            crash(job)
        return {"pid": os.getpid()}

    assert run(backend, pid_of, max_attempts=1) == 0
    pids = [json.loads(job["results"][0])["pid"] if job["results"] else None for job in backend.jobs.values()]
    assert pids[0] == pids[1] != os.getpid()  # one worker, never the batch itself
    assert pids[3] not in (None, pids[0])  # a new worker after the crash
    assert pids[5] not in (None, pids[3])  # and after a job's sys.exit()
    assert states(backend) == ["done", "done", "dead", "done", "dead", "done"]


def test_a_job_stopped_with_its_batch_is_released_not_failed():
    backend = MemoryBackend(["a", "b"])
    backend.jobs[0]["attempts"] = 2  # its last attempt comes next

    def stopped(job):
        os.kill(os.getppid(), signal.SIGTERM)  # systemd signals the whole control group
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    old = signal.signal(signal.SIGTERM, batchq_queue.on_sigterm)
    try:
        assert run(backend, stopped, max_attempts=3) == 0
    finally:
        signal.signal(signal.SIGTERM, old)
        batchq_queue.TERM["asked"] = False
    assert states(backend) == ["ready", "ready"]
    assert [job["error"] for job in backend.jobs.values()] == [None, None]


class LongPoll(MemoryBackend):
    def claim(self, limit):
        self.clock[0] += 20.0  # a long poll that waited for work
        return super().claim(limit)


def test_max_seconds_counts_from_the_claim_not_the_long_poll():
    backend = LongPoll(["a", "b"])
    backend.clock = [0.0]
    args = options(max_seconds=10.0)
    assert batchq_queue.run_batch(backend, ok, args, clock=lambda: backend.clock[0]) == 0
    assert states(backend) == ["done", "done"]


class NoHeartbeat(MemoryBackend):
    def keep_alive(self, jobs):
        raise batchq_queue.QueueError("connection refused")


def test_a_heartbeat_that_keeps_failing_is_reported_once(monkeypatch, capsys):
    monkeypatch.setattr(batchq_queue, "HEARTBEAT", 0.01)
    backend = NoHeartbeat(["a"])

    def slow(job):
        time.sleep(0.5)
        return ok(job)

    assert run(backend, slow) == 1
    assert capsys.readouterr().err.count("keep_alive: connection refused") == 1


class LosesTheQueueDuringTheFirstJob(MemoryBackend):
    """The queue's connection is lost while the first job works: every heartbeat from then fails."""

    def keep_alive(self, jobs):
        if os.path.exists(self.lost):
            raise batchq_queue.QueueError("server closed the connection unexpectedly")


def test_a_queue_lost_while_a_job_works_stops_that_job_at_once(monkeypatch, tmp_path):
    monkeypatch.setattr(batchq_queue, "HEARTBEAT", 0.05)
    backend = LosesTheQueueDuringTheFirstJob(["long", "next"])
    backend.lost = str(tmp_path / "lost")

    def long_job(job):
        open(backend.lost, "w").close()
        time.sleep(30)  # its outcome could never be recorded: it must not run on
        return ok(job)

    started = time.monotonic()
    assert run(backend, long_job, job_timeout=60.0) == 1
    assert time.monotonic() - started < 10
    assert states(backend) == ["ready", "ready"]  # given back unstarted; the queue takes them back
    assert [job["error"] for job in backend.jobs.values()] == [None, None]


class Down(MemoryBackend):
    def claim(self, limit):
        raise batchq_queue.QueueError("connection refused")


def test_a_queue_down_at_the_claim_is_exit_1():
    assert run(Down([]), ok) == 1


class LosesResults(MemoryBackend):
    def done(self, job, result):
        raise batchq_queue.QueueError("the store is full")


def test_a_queue_that_fails_at_done_is_exit_1_and_keeps_the_attempt():
    backend = LosesResults(["a"])
    assert run(backend, ok) == 1
    assert backend.jobs[0]["attempts"] == 1


class RefusesB(MemoryBackend):
    """A store with a constraint: it will not hold the result of the job whose payload is "b"."""

    def done(self, job, result):
        if job.payload == "b":
            raise batchq_queue.Refused("no b here")
        super().done(job, result)


def test_a_refused_result_fails_its_job_alone_and_backs_off(capsys):
    backend = RefusesB(["a", "b", "c"])
    assert run(backend, ok, max_attempts=2, backoff_min=30.0, backoff_max=30.0) == 0
    assert states(backend) == ["done", "ready", "done"]
    assert backend.jobs[1]["error"] == "its result was refused: no b here" and backend.jobs[1]["results"] == []
    assert backend.jobs[1]["due"] - backend.now() >= 15.0  # the backoff's lower half: it failed, like any job
    assert "job 1 attempt 1 failed: its result was refused: no b here" in capsys.readouterr().err
    backend.jobs[1]["due"] = 0.0
    assert run(backend, ok, max_attempts=2) == 1  # its last attempt: dead, and the batch did nothing else
    assert states(backend) == ["done", "dead", "done"] and backend.jobs[1]["attempts"] == 2


class StoreDown(MemoryBackend):
    def has_result(self, job):
        self.calls.append("has_result")
        raise batchq_queue.QueueError("could not connect to the results table")


def test_a_store_of_results_out_of_reach_releases_the_jobs_and_is_exit_1(capsys):
    # A host cut off from the network: whether a job was done is unknown, so none runs.
    backend = StoreDown(["a", "b", "c"])
    assert run(backend, ok) == 1
    assert backend.calls.count("has_result") == 1  # the first failure stops the batch
    assert [job["state"] for job in backend.jobs.values()] == ["ready"] * 3
    assert [job["attempts"] for job in backend.jobs.values()] == [1] * 3
    assert "the queue failed: has_result: could not connect to the results table" in capsys.readouterr().err


def test_an_outage_fails_every_job_and_exits_1_not_75(tmp_path):
    down = tmp_path / "down"
    down.touch()
    backend = MemoryBackend(['{"n": %d}' % n for n in range(3)])
    argv = ["--fail-while", str(down), "--limit", "3", "--backoff-min", "0", "--backoff-max", "0"]
    assert batchq_queue.main(argv, None, make_backend=lambda args: backend) == 1
    assert [job["attempts"] for job in backend.jobs.values()] == [1, 1, 1]
    assert all("is down" in job["error"] for job in backend.jobs.values())
    down.unlink()
    assert batchq_queue.main(argv, None, make_backend=lambda args: backend) == 75  # a full batch: more may wait
    assert states(backend) == ["done"] * 3
    assert batchq_queue.main(argv, None, make_backend=lambda args: backend) == 0


def test_the_stand_in_crashes_and_raises_on_request():
    backend = MemoryBackend(['{"crash": true}', '{"raise": true}', "not json", '{"n": 1}'])
    assert batchq_queue.main(["--max-attempts", "1"], None, make_backend=lambda args: backend) == 0
    assert states(backend) == ["dead", "dead", "done", "done"]
    assert "SIGSEGV" in backend.jobs[0]["error"] and "ValueError" in backend.jobs[1]["error"]


def test_a_crash_is_seen_though_a_helper_holds_the_report_pipe():
    backend = MemoryBackend(["a", "b"])

    def crash_beside_a_helper(job):
        if job.payload == "a":
            if os.fork() == 0:
                time.sleep(30)  # holds the report pipe open: no end of file comes
                os._exit(0)
            os._exit(4)
        return ok(job)

    started = time.monotonic()
    assert run(backend, crash_beside_a_helper, job_timeout=20.0, max_attempts=1) == 0
    assert time.monotonic() - started < 10  # not the job's timeout
    assert states(backend) == ["dead", "done"]
    assert "ended with status 4" in backend.jobs[0]["error"]


# A batch of one 20 s job on the in-memory queue; at its end it writes the job's state to argv[1].
TWENTY_SECOND_BATCH = """
import json, sys, time
import batchq_queue

backend = batchq_queue.MemoryBackend(["slow"])

def process(job):
    time.sleep(20)
    return {}

try:
    code = batchq_queue.main(["--job-timeout", "600"], process, make_backend=lambda args: backend)
finally:
    with open(sys.argv[1], "w") as out:
        json.dump(backend.jobs[0], out)
sys.exit(code)
"""


def test_a_drains_timeout_reaches_the_job_and_gives_it_back(tmp_path):
    """The drain's runner (batchq-drain) ends a batch past its timeout (3 s) with SIGTERM
    to the batch's process group, and SIGKILL after the stop timeout (10 s). The job at
    work must end with the SIGTERM, so that the batch gives it back, long before the SIGKILL."""
    script = tmp_path / "batch.py"
    script.write_text(TWENTY_SECOND_BATCH)
    state = tmp_path / "job.json"
    env = {key: value for key, value in os.environ.items() if key != "INVOCATION_ID"}  # no systemd here
    env["PYTHONPATH"] = os.path.dirname(batchq_queue.__file__)
    started = time.monotonic()
    (tmp_path / "spec.json").write_text(drain_runner.spec(timeout_s=3, stop_timeout_s=10))
    runner = subprocess.Popen([sys.executable, str(drain_runner.RUNNER)] + drain_runner.arguments(
        tmp_path / "spec.json", [sys.executable, script, state]), env=env)
    try:
        assert runner.wait(timeout=60) == -signal.SIGTERM  # the run failed at its timeout, as systemd's would
    finally:
        runner.kill()
    assert time.monotonic() - started < 9  # 3 s and the batch's own end, not the stop timeout's 10 s more
    job = json.loads(state.read_text())
    assert job["state"] == "ready" and job["attempts"] == 1 and job["error"] is None


def test_a_job_id_that_is_not_printable_stays_on_one_line_of_stderr(capsys):
    backend = MemoryBackend(["a"])
    backend.jobs["two\nlines"] = backend.jobs.pop(0)
    assert run(backend, crash_always, max_attempts=1) == 1
    failed = [line for line in capsys.readouterr().err.splitlines() if "attempt 1 failed" in line]
    assert failed == ['batchq: job "two\\nlines" attempt 1 failed: ValueError: no']


def crash_always(job):
    raise ValueError("no")


class HoldsOutcomes(MemoryBackend):
    """A store that holds done outcomes back (hold_seconds) and writes them together, as the
    PostgreSQL consumer does. It refuses the result of each payload in refuse; with lost, its
    connection is lost at the first write."""
    hold_seconds = 0.05

    def __init__(self, payloads, refuse=(), lost=False):
        super().__init__(payloads)
        self.held = []
        self.refuse = set(refuse)
        self.lost = lost
        self.writes = []  # (when, the job ids written together)

    def done(self, job, result):
        self._claimed(job)
        self.held.append((job, result, time.monotonic()))

    def start(self, job):
        self.calls.append("start %s" % job.id)

    def flush(self, everything):
        if not self.held or not (everything or time.monotonic() - self.held[0][2] >= self.hold_seconds):
            return []
        if self.lost:
            self.held.clear()
            raise batchq_queue.QueueError("server closed the connection unexpectedly")
        written, self.held = self.held, []
        self.writes.append((time.monotonic(), [job.id for job, _result, _when in written]))
        for job, result, _when in written:
            if job.payload not in self.refuse:
                super().done(job, result)
        return [(job, "no %s here" % job.payload if job.payload in self.refuse else None)
                for job, _result, _when in written]


def test_held_outcomes_are_written_together_each_once_and_all_by_the_batchs_end():
    backend = HoldsOutcomes(["a", "b", "c", "d", "e", "f"])
    assert run(backend, ok) == 0
    assert states(backend) == ["done"] * 6
    assert sorted(job for _when, jobs in backend.writes for job in jobs) == list(range(6))
    assert len(backend.writes) < 6  # at least two outcomes shared a write


def test_a_held_outcome_is_written_while_the_next_job_works():
    # A job of 0.8 s after a quick one: the quick one's outcome is written within hold_seconds of its
    # end (the batch wakes that often), not after the long job.
    backend = HoldsOutcomes(["quick", "slow"])
    assert run(backend, lambda job: time.sleep(0.8 if job.payload == "slow" else 0)) == 0
    (first, first_jobs), (second, second_jobs) = backend.writes
    assert (first_jobs, second_jobs) == ([0], [1]) and second - first >= 0.5, backend.writes


def test_a_result_refused_when_held_outcomes_are_written_fails_that_job_alone(capsys):
    backend = HoldsOutcomes(["a", "b", "c"], refuse={"b"})
    assert run(backend, ok, max_attempts=2, backoff_min=30.0, backoff_max=30.0) == 0
    assert states(backend) == ["done", "ready", "done"]
    assert backend.jobs[1]["error"] == "its result was refused: no b here" and backend.jobs[1]["results"] == []
    assert backend.jobs[1]["due"] - backend.now() >= 15.0  # the backoff's lower half, as for any failure
    assert "job 1 attempt 1 failed: its result was refused: no b here" in capsys.readouterr().err
    # A batch whose only job's result is refused did nothing: exit 1, not a success.
    backend = HoldsOutcomes(["b"], refuse={"b"})
    assert run(backend, ok, max_attempts=1) == 1 and states(backend) == ["dead"]


def test_held_outcomes_lost_with_the_queue_are_not_counted_done_and_no_job_starts(capsys):
    backend = HoldsOutcomes(["a", "b", "c"], lost=True)
    assert run(backend, lambda job: time.sleep(0.2)) == 1
    assert [call for call in backend.calls if call.startswith("start")] == ["start 0", "start 1"]
    # the first is unknown to the queue (taken back later); the second, stopped at work, and the third go back
    assert states(backend) == ["claimed", "ready", "ready"]
    err = capsys.readouterr().err
    assert "the queue failed: flush: server closed the connection unexpectedly" in err and '"done": 0' in err
