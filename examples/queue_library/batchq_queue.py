# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The consumer contract in one module: one batch of a queue, then exit.

Python 3.9+, standard library only. A queue plugs in as a Backend; you
write one function, process(job). A complete consumer of an SQS queue:

    #!/usr/bin/python3
    import hashlib
    import sys
    sys.path.insert(0, "/usr/local/lib/batchq-queue")   # where install.yml puts it
    import batchq_queue
    import batchq_sqs                               # examples/sqs_queue/batchq-sqs

    def process(job):
        # job.payload is the message body as text. Raise to fail the job.
        # Return anything JSON can hold: it is the job's result.
        return {"sha256": hashlib.sha256(job.payload.encode()).hexdigest()}

    if __name__ == "__main__":
        sys.exit(batchq_queue.main(sys.argv[1:], process, batchq_sqs.add_options,
                                   batchq_sqs.backend, batchq_sqs.check))

The contract (the same as batchq-spool's and batchq-pgqueue's):
- A batch claims at most --limit jobs. The backend counts each job's
  attempt when it claims it, before any work. An attempt is never given
  back, so every path that ends a batch early is bounded.
- The jobs of a batch run process(job) one at a time in a worker, a child
  process of the batch, with --job-timeout each. A crash (SIGSEGV),
  sys.exit(), a hang, an error of any class or text, or a result JSON
  cannot hold fails that job alone; the next job gets a new worker when the
  job ended the one before. (One process per batch, not per job: a fork
  costs more than a small job.) A process a job starts and leaves running
  ends with the worker, at the latest at the batch's end.
- A failed job waits a backoff before it is due again: --backoff-min
  doubling per attempt up to --backoff-max, the upper half of it at random
  (jitter, so jobs that failed together do not come back together).
- A job that fails its --max-attempts-th attempt is dead. A job claimed
  with more attempts than that (the batches of its earlier attempts died
  before they could tell) is dead before any work, unless its result was
  applied already: then it is done.
- A result is applied once: the backend's done() must see to that.
- A result the queue refuses (done() raises Refused: a name clash, a size
  limit, a constraint) fails that job alone, as if its work had failed.
- Once the queue fails (a lost connection, a store of results out of
  reach), no job starts: its outcome could not be recorded, and whether it
  was done may be unknown. The jobs not started go back, and the batch
  exits 1.
- No claim is made after SIGTERM, and no new job starts after SIGTERM or
  after --max-seconds. The jobs not started go back to the queue
  (release). The batch passes its SIGTERM on to the job at work: systemd's
  stop signals the whole control group, but a drain's runner at a batch's
  timeout signals the batch's process group only. A job that SIGTERM ended
  goes back too: it is not charged as a failure. They keep the attempt:
  SQS cannot give one back. So a job that is released in --max-attempts
  batches in a row is dead without work: give --max-seconds room for a
  whole batch, so that it ends a batch early only when something is wrong.

Exit codes: 0 when the batch took nothing, or less than a full batch and
nothing more waits. --backlog-exit-code (75) when it did at least one job
and more work waits. 1 when it claimed jobs, did none, and at least one
failed or was dead (an outage is a failure, not a backlog), or the queue
failed (claim, or recording an outcome). 2 for a bad option, before
anything is claimed.
"""

import argparse
import contextlib
import ctypes
import fcntl
import json
import math
import os
import random
import re
import select
import signal
import sys
import time
import traceback

# Error texts are cut to this many characters.
ERROR_CHARS = 2000
# A result's JSON text may have at most this many bytes.
RESULT_BYTES = 1 << 20
# A report from a job's child larger than this fails the job.
# The report encodes the result's JSON text again. That text is ASCII (json.dumps escapes the rest).
# Encoding it again turns each backslash and quote into two bytes, and nothing into more.
# An error report is far smaller: ERROR_CHARS characters of at most 12 bytes each.
REPORT_BYTES = 2 * RESULT_BYTES + 1024
MOST_ATTEMPTS = 1000
# The longest --backoff-min and --backoff-max, in seconds: a week.
# A backend may allow less (SQS: 12 hours).
MOST_BACKOFF = 7 * 24 * 3600.0
# How often, in seconds, the batch asks the backend to keep its jobs claimed.
HEARTBEAT = 1.0
TERM = {"asked": False}


class QueueError(Exception):
    """The queue failed (not one job's work): the batch exits 1."""


class Refused(Exception):
    """done() raises it when the queue will not hold a job's result (a constraint, a text it
    cannot store). The job fails, as if its work had; the batch goes on."""


class Job:
    """One claimed job. id is stable across deliveries. attempts counts this one.
    group is the job's ordering group (an SQS FIFO group), or None.
    handle is the backend's own (a receipt handle, a row id).
    attributes are what the producer sent beside the payload (SQS message
    attributes: name to text), or an empty dict."""

    def __init__(self, job_id, payload, attempts, handle=None, group=None, attributes=None):
        self.id = job_id
        self.payload = payload
        self.attempts = attempts
        self.handle = handle
        self.group = group
        self.attributes = dict(attributes or {})

    def __repr__(self):
        return "Job(%r, attempts=%d)" % (self.id, self.attempts)


class Backend:
    """What a queue implements. Each method raises QueueError when the queue fails."""

    # The longest, in seconds, that done() may hold a job's outcome back to write it together
    # with the outcomes of the jobs that end meanwhile (flush()). 0: done() writes it at once.
    hold_seconds = 0.0

    def claim(self, limit):
        """Up to limit jobs, each with its attempt counted. [] only when the queue is empty."""
        raise NotImplementedError

    def start(self, job):
        """Called just before the job's work starts. A backend that gives back the attempts
        of jobs not started (the spool) notes here the one at work."""

    def has_result(self, job):
        """True when the job's result was applied already (a second delivery): it is acked, not run."""
        return False

    def keep_alive(self, jobs):
        """Called about every HEARTBEAT seconds while jobs are held: keep them claimed."""

    def done(self, job, result):
        """Apply the result (JSON text, or None when has_result was True) once, and remove the job.
        Raises Refused, with nothing applied, when the queue will not hold this result.
        With hold_seconds, it may hold the outcome back instead, for flush() to write."""
        raise NotImplementedError

    def flush(self, everything):
        """Write the outcomes that done() holds back: those held hold_seconds or longer, or all of
        them when everything is True (the batch ends). Returns [(job, refusal)] for each job whose
        outcome this call wrote: refusal is None, or the text of the queue's refusal of its result
        (nothing of it is applied; the library fails the job, as if done() had raised Refused).
        Raises QueueError when the queue failed: no outcome held is known written then."""
        return []

    def failed(self, job, error, delay):
        """The job's attempt failed: due again in delay seconds."""
        raise NotImplementedError

    def dead(self, job, error):
        """The job used its last attempt: off the queue, kept for a person."""
        raise NotImplementedError

    def release(self, jobs):
        """Jobs claimed but not started go back, due now. Their attempt stays counted."""

    def finish(self):
        """The batch is over: flush what is buffered."""

    def more(self):
        """True when more due work waits (a hint; a full batch counts as more already)."""
        return False


# The characters XML 1.0 allows, and so SQS. Any other one is written as an escape.
UNSAFE = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _escape(match):
    code = ord(match.group())
    return "\\x%02x" % code if code < 0x100 else "\\u%04x" % code


def clean_text(text):
    """text as UTF-8 and every store can hold it: control characters, U+FFFE, U+FFFF and lone
    surrogates as escapes, cut to ERROR_CHARS. Cleaning twice changes nothing more."""
    text = UNSAFE.sub(_escape, text)
    if len(text) <= ERROR_CHARS:
        return text
    said = "... (%d characters)" % len(text)
    return text[:ERROR_CHARS - len(said)] + said


def shown(job_id):
    """A job's id on one line of stderr: as it is when printable, else quoted with escapes
    (a file's name may hold a newline)."""
    text = str(job_id)
    return text if text.isprintable() else json.dumps(text)


def error_text(exc):
    """What a job's failure says, whatever its class and text."""
    try:
        text = "%s: %s" % (type(exc).__name__, exc)
    except Exception:  # pylint: disable=broad-except  # a __str__ that fails itself
        text = type(exc).__name__
    return clean_text(text)


def backoff(attempts, low, high, uniform=random.uniform):
    """Seconds a job waits after its attempts-th failed attempt: low doubling
    per attempt up to high, the upper half of that span at random."""
    span = min(high, low * 2.0 ** min(max(attempts - 1, 0), 64))  # the exponent is bounded: no overflow
    return span / 2.0 + uniform(0.0, span / 2.0)


def exit_code(claimed, done, failed, error, more, backlog):
    """The batch's exit status. failed counts failed and dead jobs; more is True when work is left."""
    if error or (claimed and not done and failed):
        return 1  # an outage is a failure, not a backlog
    return backlog if done and more else 0


def death(status):
    """What ended a child process, from its wait status."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return "killed by %s" % signal.Signals(number).name
        except ValueError:  # a real-time signal has no name
            return "killed by signal %d" % number
    return "ended with status %d" % os.WEXITSTATUS(status)


def add_common_options(parser):
    parser.add_argument("--limit", type=int, default=100, help="jobs a batch claims at most")
    parser.add_argument("--max-attempts", type=int, default=5, help="attempts before a job is dead")
    parser.add_argument("--backoff-min", type=float, default=10.0, help="seconds after a first failure")
    parser.add_argument("--backoff-max", type=float, default=3600.0, help="the longest backoff, in seconds")
    parser.add_argument("--job-timeout", type=float, default=300.0, help="seconds a job may run")
    parser.add_argument("--max-seconds", type=float, default=0.0,
                        help="no new job this many seconds after the claim (0: no limit)")
    parser.add_argument("--backlog-exit-code", type=int, default=75, help="the consumer's backlog_exit_code")
    parser.add_argument("--work-ms", type=float, default=0.0, help="the stand-in's work per job")
    parser.add_argument("--fail-while", metavar="PATH",
                        help="the stand-in fails every job while PATH exists (an outage)")


def option_problem(args):
    """What is wrong with the common options, naming the first one at fault; None when nothing is."""
    finite = math.isfinite  # a comparison with nan is always false, and inf is no span
    checks = [
        ("--limit", 1 <= args.limit <= 100000, "a number of jobs from 1 to 100000"),
        ("--max-attempts", 1 <= args.max_attempts <= MOST_ATTEMPTS, "from 1 to %d" % MOST_ATTEMPTS),
        ("--backoff-min", finite(args.backoff_min) and 0 <= args.backoff_min <= MOST_BACKOFF,
         "0 to %d seconds" % MOST_BACKOFF),
        ("--backoff-max", finite(args.backoff_max) and args.backoff_min <= args.backoff_max <= MOST_BACKOFF,
         "from --backoff-min to %d seconds" % MOST_BACKOFF),
        ("--job-timeout", finite(args.job_timeout) and 0 < args.job_timeout <= 86400,
         "more than 0 seconds, at most a day"),
        ("--max-seconds", finite(args.max_seconds) and args.max_seconds >= 0, "0 (no limit) or more seconds"),
        ("--backlog-exit-code", 3 <= args.backlog_exit_code <= 125, "an exit code from 3 to 125"),
        ("--work-ms", finite(args.work_ms) and 0 <= args.work_ms <= 86400000, "0 or more milliseconds"),
    ]
    for option, good, wanted in checks:
        if not good:
            return "%s: must be %s, got %s" % (option, wanted, getattr(args, option[2:].replace("-", "_")))
    return None


def stand_in(args):
    """The example's process(job): waits --work-ms, fails while --fail-while exists, and obeys the
    payload's faults when it is a JSON object: {"crash": true} SIGSEGV, {"raise": true} raises."""
    def process(job):
        time.sleep(args.work_ms / 1000.0)
        if args.fail_while and os.path.exists(args.fail_while):
            raise ConnectionError("the service this job calls is down (%s exists)" % args.fail_while)
        try:
            payload = json.loads(job.payload)
        except (TypeError, ValueError):
            payload = None
        if isinstance(payload, dict):
            if payload.get("crash"):
                import faulthandler  # pylint: disable=import-outside-toplevel
                import resource  # pylint: disable=import-outside-toplevel
                faulthandler.disable()  # a stand-in crash: no stack dump, no core file
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                os.kill(os.getpid(), signal.SIGSEGV)
            if payload.get("raise"):
                raise ValueError("job payload asks to raise")
        return {"job": str(job.id), "bytes": len(str(job.payload))}
    return process


def append_record(path, line, limit, mode=0o640):
    """Append line (bytes) to the records file at path, under an exclusive
    lock; once it holds limit bytes, it becomes path.1. A writer that opened
    the file just before another rotated it writes again, to the new file."""
    while True:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(descriptor).st_ino:
                    os.write(descriptor, line)
                    if os.fstat(descriptor).st_size >= limit:
                        os.replace(path, path + ".1")
                    return
        finally:
            os.close(descriptor)  # and with it the lock


def flush_stdio():
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def write_all(descriptor, data):
    while data:
        data = data[os.write(descriptor, data):]


class WorkerEnded(Exception):
    """The worker process ended with a job: its outcome is the argument; the next job needs a new worker."""


class WorkerGone(Exception):
    """The worker process was gone before the job could start: the job may start on a new one."""


def _report(process, job):
    """The report of process(job): ["done", result JSON text] or ["failed", error]."""
    try:
        result = process(job)
        text = json.dumps(result, allow_nan=False)
    except Exception as exc:  # pylint: disable=broad-except  # any error of the job fails the job alone
        return ["failed", error_text(exc)]
    if len(text.encode("utf-8", "surrogatepass")) > RESULT_BYTES:
        return ["failed", "its result has more than %d bytes" % RESULT_BYTES]
    # json.dumps escapes every character outside ASCII, a lone surrogate too: the text is ASCII.
    return ["done", text]


def _serve(process, jobs, orders, reports):
    """In the worker: read a job's index, run it, write one report line; until the
    orders end. Never returns. A job that raises SystemExit or KeyboardInterrupt
    fails, and the worker ends after its report: the job asked for an exit."""
    status = 0
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with os.fdopen(orders, "rb") as lines:
            for line in lines:
                ending = False
                try:
                    report = _report(process, jobs[int(line)])
                except BaseException as exc:  # pylint: disable=broad-except  # SystemExit too: the job's
                    report, ending = ["failed", error_text(exc)], True
                flush_stdio()
                write_all(reports, (json.dumps(report + [ending]) + "\n").encode())
                if ending:
                    break
    except BaseException:  # pylint: disable=broad-except  # no report: the batch fails the job
        with contextlib.suppress(Exception):
            traceback.print_exc()
        status = 1
    finally:
        flush_stdio()
        os._exit(status)  # no atexit handlers, no buffers of the batch written twice


# prctl(2) option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def die_with_parent(parent):
    """In the worker: be killed when the batch's process dies.

    The worker leads a process group of its own, so that a hung job is killed
    with what it started. A drain's runner kills a batch that outlasts its
    timeout by the batch's process group, which then misses the worker: without
    this, a job would run on beside the next batch. Linux only; elsewhere the
    worker outlives a killed batch until its job ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the batch died before prctl(): no signal will come
        os._exit(1)


# The batch's worker process, while one runs: the SIGTERM handler forwards the stop to it.
WORKER = {"pid": 0}


class Worker:
    """One child process that runs process(job) for a batch's jobs, one at a time.

    A process per batch, not per job: a fork costs more than a small job. The
    isolation stays: a crash, a hang, an exit or a result JSON cannot hold
    fails the job at hand alone, and the next job gets a new worker. The worker
    is forked after the claim, so it holds the claimed jobs; the batch sends it
    a job's index and reads one report line back."""

    def __init__(self, process, jobs):
        flush_stdio()
        order_read, self.orders = os.pipe()
        self.reports, report_write = os.pipe()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.orders)
            os.close(self.reports)
            with contextlib.suppress(OSError):
                os.setpgid(0, 0)  # a group of its own: a hung job is killed with what it started
            die_with_parent(parent)
            _serve(process, jobs, order_read, report_write)
        with contextlib.suppress(OSError):
            os.setpgid(self.pid, self.pid)
        os.close(order_read)
        os.close(report_write)
        self.status = None  # its wait status, once it ended
        self.closed = False
        WORKER["pid"] = self.pid
        if TERM["asked"]:  # a stop that came during the fork: forward it now
            self.signal(signal.SIGTERM)

    def signal(self, number):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, number)

    def run(self, index, timeout, keep_alive, heartbeat):
        """("done", result JSON text) or ("failed", error) of the index-th job. Raises
        WorkerEnded with the outcome when the worker must not serve another job: a crash,
        a timeout, or ("stopped", why) when a stop or a failed queue ended the job."""
        try:
            write_all(self.orders, b"%d\n" % index)
        except OSError as exc:  # the worker died between two jobs (the OOM killer, a stray signal)
            self.close()
            raise WorkerGone() from exc
        started = time.monotonic()
        data = b""
        while True:
            left = started + timeout - time.monotonic()
            if left <= 0:
                self.close()
                raise WorkerEnded(("failed", "its work outlasted --job-timeout (%gs)" % timeout))
            ready, _writable, _errors = select.select([self.reports], [], [], min(left, heartbeat))
            queue_up = keep_alive()
            if not ready:
                if not queue_up:
                    # The queue failed (a lost connection): the job's outcome could not be recorded.
                    self.close()
                    raise WorkerEnded(("stopped", "the queue failed while its work ran"))
                if self.exited():  # a process the job started may hold the pipe open: no EOF
                    break
                continue
            chunk = os.read(self.reports, 65536)
            data += chunk
            if not chunk or len(data) > REPORT_BYTES:
                break
            if data.endswith(b"\n"):
                return self.parse(data)
        self.close()
        if data and len(data) > REPORT_BYTES:
            raise WorkerEnded(("failed", "its report had more than %d bytes" % REPORT_BYTES))
        if TERM["asked"] and os.WIFSIGNALED(self.status) and os.WTERMSIG(self.status) == signal.SIGTERM:
            # A stop reached the job: it was stopped, it did not fail.
            raise WorkerEnded(("stopped", "its work's process was stopped by SIGTERM"))
        raise WorkerEnded(("failed", "its work's process was %s before it reported" % death(self.status)))

    def parse(self, data):
        """A report line: [kind, text, whether the worker ends after it]."""
        try:
            kind, text, ending = json.loads(data.decode("utf-8"))
            if kind in ("done", "failed") and isinstance(text, str):
                if ending:
                    self.close()
                    raise WorkerEnded((kind, text))
                return (kind, text)
        except (ValueError, UnicodeDecodeError):
            pass
        self.close()
        raise WorkerEnded(("failed", "its work's process wrote a report that is not one"))

    def exited(self):
        """Whether the worker has ended (then reaped, its status kept)."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
        return self.status is not None

    def close(self):
        """End the worker and whatever its jobs left running in its process group.
        A worker that died already keeps the status it died with."""
        if self.closed:
            return
        self.closed = True
        WORKER["pid"] = 0
        for descriptor in (self.orders, self.reports):
            with contextlib.suppress(OSError):
                os.close(descriptor)
        self.signal(signal.SIGKILL)
        if self.status is None:
            _pid, self.status = os.waitpid(self.pid, 0)


class Workers:
    """The batch's worker: forked for the first job, and again after a job ended the one before."""

    def __init__(self, process, jobs):
        self.process = process
        self.jobs = jobs
        self.worker = None

    def run(self, index, timeout, keep_alive, heartbeat=None):
        """("done", result JSON text), ("failed", error) or ("stopped", why) of the index-th job.
        keep_alive() is called at least every heartbeat seconds (HEARTBEAT) while the job works."""
        heartbeat = min(heartbeat or HEARTBEAT, HEARTBEAT)  # HEARTBEAT read now: a test may shorten it
        for _try in range(2):  # a worker found dead before the job started gets one successor
            if self.worker is None:
                self.worker = Worker(self.process, self.jobs)
            try:
                return self.worker.run(index, timeout, keep_alive, heartbeat)
            except WorkerGone:
                self.worker = None
            except WorkerEnded as ended:
                self.worker = None
                return ended.args[0]
        return ("failed", "its work's process ended before the job could start, twice")

    def close(self):
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def run_batch(backend, process, args, clock=time.monotonic, uniform=random.uniform):
    """One batch; returns its exit code. Never raises QueueError."""
    counts = {"claimed": 0, "done": 0, "failed": 0, "dead": 0, "released": 0}
    errors = []
    if TERM["asked"]:  # a stop before the claim: claim nothing
        print("batchq: stopped before the claim", file=sys.stderr)
        return 0
    try:
        jobs = backend.claim(args.limit)
    except QueueError as exc:
        print("batchq: the queue failed at the claim: %s" % clean_text(str(exc)), file=sys.stderr)
        return 1
    # --max-seconds counts from here: a long poll that waited for work used none of it.
    start = clock()
    counts["claimed"] = len(jobs)
    held = list(jobs)
    # A FIFO group whose job failed holds the rest of its jobs in this batch: they go back unstarted.
    blocked = set()

    # The jobs whose outcome the backend holds (hold_seconds): not yet known written. A job counts
    # as done once its outcome is written.
    unsettled = []

    def took(job):
        """done() returned: the job's outcome is written, or held by the backend."""
        if backend.hold_seconds > 0:
            unsettled.append(job)
        else:
            counts["done"] += 1

    def settle(everything):
        """The outcomes the backend held and wrote now; a result it refused fails its job."""
        if not unsettled:
            return
        try:
            written = backend.flush(everything)
        except QueueError as exc:
            error = "flush: %s" % clean_text(str(exc))
            if error not in errors:
                errors.append(error)
            unsettled.clear()  # whether they were written is unknown
            return
        for job, refusal in written:
            unsettled.remove(job)
            if refusal is None:
                counts["done"] += 1
            else:
                fail(job, "its result was refused: %s" % clean_text(refusal))

    def keep_alive():
        """Keep the held jobs claimed, and write the outcomes held long enough: False once the queue failed."""
        try:
            backend.keep_alive(held)
        except QueueError as exc:
            error = "keep_alive: %s" % clean_text(str(exc))
            if error not in errors:  # a queue down during a long job fails every heartbeat alike
                errors.append(error)
        if not errors:
            settle(False)
        return not errors

    def outcome(call, *values):
        try:
            call(*values)
            return True
        except QueueError as exc:
            errors.append("%s: %s" % (call.__name__, clean_text(str(exc))))
            return False

    def fail(job, text):
        """The job's attempt failed: it backs off, or is dead after its last attempt."""
        print("batchq: job %s attempt %d failed: %s" % (shown(job.id), job.attempts, text), file=sys.stderr)
        if job.group is not None:
            blocked.add(job.group)
        if job.attempts >= args.max_attempts:
            outcome(backend.dead, job, text)
            counts["dead"] += 1
        else:
            outcome(backend.failed, job, text, backoff(job.attempts, args.backoff_min, args.backoff_max, uniform))
            counts["failed"] += 1

    unstarted = []
    workers = Workers(process, jobs)
    try:
        for index, job in enumerate(jobs):
            # Between jobs too: the last one's outcome (an fsync, a send) may have taken a while.
            keep_alive()
            late = TERM["asked"] or (args.max_seconds and clock() - start >= args.max_seconds)
            # Once the queue failed (a lost connection, a store out of reach), no job starts:
            # its outcome could not be recorded, and whether it was done may be unknown.
            if late or errors or (job.group is not None and job.group in blocked):
                unstarted.append(job)
                continue
            # A result stored already wins over the attempts: only its delete was lost.
            try:
                stored = backend.has_result(job)
            except QueueError as exc:
                # Whether it was done is unknown: it goes back unstarted, and so do the jobs after it.
                errors.append("has_result: %s" % clean_text(str(exc)))
                unstarted.append(job)
                continue
            if stored:
                if outcome(backend.done, job, None):
                    took(job)
            elif job.attempts > args.max_attempts:
                # Its earlier attempts' batches died before they could tell.
                outcome(backend.dead, job, "its attempts ran out (%d of %d) in batches that died"
                        % (job.attempts - 1, args.max_attempts))
                counts["dead"] += 1
            elif not outcome(backend.start, job):
                unstarted.append(job)
                continue
            else:
                # While the backend holds outcomes, the batch wakes often enough to write them in time.
                kind, text = workers.run(index, args.job_timeout, keep_alive,
                                         backend.hold_seconds if unsettled else None)
                if kind == "stopped":
                    unstarted.append(job)  # released as if not started: no failure is charged
                    continue
                if kind == "done":
                    try:
                        if outcome(backend.done, job, text):
                            took(job)
                    except Refused as exc:
                        kind, text = "failed", "its result was refused: %s" % clean_text(str(exc))
                if kind == "failed":
                    fail(job, text)
            held.remove(job)
    finally:
        workers.close()  # and what its jobs left running
    settle(True)
    if unstarted:
        counts["released"] = len(unstarted)
        outcome(backend.release, unstarted)
    outcome(backend.finish)
    more = bool(unstarted) or len(jobs) >= args.limit
    if not more and not errors:
        try:
            more = backend.more()
        except QueueError as exc:
            errors.append("more: %s" % clean_text(str(exc)))
    for error in errors:
        print("batchq: the queue failed: %s" % error, file=sys.stderr)
    code = exit_code(counts["claimed"], counts["done"], counts["failed"] + counts["dead"], errors, more,
                     args.backlog_exit_code)
    print("batchq: batch %s, exit %d" % (json.dumps(counts, sort_keys=True), code), file=sys.stderr)
    return code


def on_sigterm(_signum, _frame):
    """A stop: no new job starts, and the job at work gets the SIGTERM too. systemd's
    stop signals the whole control group, but a drain's runner at a batch's timeout
    signals the batch's process group only, and the worker leads a group of its own."""
    TERM["asked"] = True
    if WORKER["pid"]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(WORKER["pid"], signal.SIGTERM)


def main(argv, process, add_options=None, make_backend=None, check=None, description=None):
    """Parse argv, make the backend, run one batch: the exit code. process(job) may be
    None for the stand-in. check(args) says what is wrong with the backend's own options.
    make_backend(args) may exit 2 itself on a bad queue setting, before any claim."""
    parser = argparse.ArgumentParser(description=description)
    add_common_options(parser)
    if add_options:
        add_options(parser)
    args = parser.parse_args(argv)
    problem = option_problem(args)
    if problem is None and check:
        problem = check(args)
    if problem:
        parser.exit(2, "%s: error: %s\n" % (parser.prog, problem))
    signal.signal(signal.SIGTERM, on_sigterm)
    backend = make_backend(args)
    return run_batch(backend, process or stand_in(args), args)


class MemoryBackend(Backend):
    """A queue in memory, for tests: the jobs' states, attempts and results, and every call made.
    now() is a clock in seconds; due times use it."""

    def __init__(self, payloads, now=time.monotonic):
        self.now = now
        self.jobs = {}
        for number, payload in enumerate(payloads):
            self.jobs[number] = {"payload": payload, "attempts": 0, "state": "ready", "due": 0.0,
                                 "results": [], "error": None}
        self.calls = []

    def claim(self, limit):
        self.calls.append("claim")
        jobs = []
        for job_id, job in sorted(self.jobs.items()):
            if len(jobs) >= limit:
                break
            if job["state"] == "ready" and job["due"] <= self.now():
                job["state"] = "claimed"
                job["attempts"] += 1  # counted before any work
                jobs.append(Job(job_id, job["payload"], job["attempts"]))
        return jobs

    def _claimed(self, job):
        if self.jobs[job.id]["state"] != "claimed":
            raise AssertionError("job %s is %s, not claimed" % (job.id, self.jobs[job.id]["state"]))
        return self.jobs[job.id]

    def has_result(self, job):
        return bool(self.jobs[job.id]["results"])

    def done(self, job, result):
        entry = self._claimed(job)
        if result is not None:
            entry["results"].append(result)
        entry["state"] = "done"

    def failed(self, job, error, delay):
        entry = self._claimed(job)
        entry.update(state="ready", due=self.now() + delay, error=error)

    def dead(self, job, error):
        entry = self._claimed(job)
        entry.update(state="dead", error=error)

    def release(self, jobs):
        for job in jobs:
            self._claimed(job)["state"] = "ready"

    def more(self):
        return any(job["state"] == "ready" and job["due"] <= self.now() for job in self.jobs.values())
