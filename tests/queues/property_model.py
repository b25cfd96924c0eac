"""The property model of the queue library: the jobs hypothesis draws, what each does, how each must end.

One model for every backend. tests/queues/test_property.py drains its jobs
from the in-memory backend, from SQS on a moto server and from a spool
directory; tests/pgqueue/test_property.py from PostgreSQL, where
tests/pgqueue/property_consumer.py runs them in a client container. There this
module sits beside the library: the standard library alone, Python 3.9 and
later. Hypothesis is imported by plan() alone: the containers do not have it.

A job is a step: ("ok",), ("flood",) (1 MB on stdout and on stderr),
("flaky", N) (fails its first N attempts), ("raise", E, TEXT) (raises
EXCEPTIONS[E] with TEXT), ("notjson", KIND) (returns what JSON cannot hold),
("segv",), ("hang",) (outlasts any --job-timeout of the tests). Two kinds only
the tests of PostgreSQL draw (plan's kinds): ("oddresult", TEXT), a result
that PostgreSQL's text type refuses, and ("undecodable",), a payload that
Python's json cannot decode.

A job's payload carries its step: {"i": INDEX, "do": [KIND, ...]}, with each
text as hex of its UTF-8 (lone surrogates passed through), because neither
SQS nor PostgreSQL's jsonb holds every text. HUGE stands for 1 MB of text.
"""

import faulthandler
import json
import os
import resource
import signal
import sys
import time

KINDS = ("ok", "flood", "flaky", "raise", "notjson", "segv", "hang")
ODD_RESULT, UNDECODABLE = "oddresult", "undecodable"
HUGE = "huge"
ODD_TEXTS = ["", "a NUL \x00 byte", "a lone \udcff surrogate", HUGE, "\ud800", "\n" * 5000,
             "".join(map(chr, range(32))), "\x1b[31mred\x1b[0m", "\x7f\uffff\ufffe"]
# Texts that PostgreSQL's text type refuses.
ODD_RESULTS = ["a NUL \x00 byte", "a lone \udcff surrogate"]
# Valid JSON (and jsonb) that Python's json refuses: too deep for its decoder.
UNDECODABLE_PAYLOAD = "[" * 5000 + "]" * 5000
# A hang outlasts every --job-timeout of the tests by far.
HANG_SECONDS = 60


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("a __str__ that fails")


EXCEPTIONS = [ValueError, KeyError, RuntimeError, SystemExit, KeyboardInterrupt, MemoryError, GeneratorExit,
              BadStr, UnicodeError]
NOT_JSON = {"set": lambda: {1}, "nan": lambda: float("nan"), "object": object, "bytes": lambda: b"x",
            "inf": lambda: [float("inf")]}


def plan(kinds=KINDS, max_jobs=6, faults=()):
    """The strategy of one drain: its jobs (steps of kinds), --limit, --max-attempts, and with faults a
    fault or none: (a kind of faults, N), at the N-th job started."""
    from hypothesis import strategies as st  # pylint: disable=import-outside-toplevel

    steps = {
        "ok": st.just(("ok",)),
        "flood": st.just(("flood",)),
        "flaky": st.tuples(st.just("flaky"), st.integers(1, 2)),
        "raise": st.tuples(st.just("raise"), st.sampled_from(range(len(EXCEPTIONS))),
                           st.one_of(st.sampled_from(ODD_TEXTS), st.text(max_size=40))),
        "notjson": st.tuples(st.just("notjson"), st.sampled_from(sorted(NOT_JSON))),
        ODD_RESULT: st.tuples(st.just(ODD_RESULT), st.sampled_from(ODD_RESULTS)),
        "segv": st.just(("segv",)),
        "hang": st.just(("hang",)),
        UNDECODABLE: st.just((UNDECODABLE,)),
    }
    fields = {
        "jobs": st.lists(st.one_of([steps[kind] for kind in kinds]), min_size=1, max_size=max_jobs),
        "limit": st.integers(1, 4),
        "max_attempts": st.integers(1, 3),
    }
    if faults:
        # N at most the number of jobs: each is started once at least
        fields["fault"] = st.one_of(st.none(), st.tuples(st.sampled_from(faults), st.integers(1, max_jobs)))
    return st.fixed_dictionaries(fields)


def ending(step, max_attempts, lost=0):
    """How the job of step must end: "done", "dead", or "either" when a fault may have cost it lost
    attempts. A flaky job needs one attempt more than it fails."""
    if step[0] in ("ok", "flood"):
        return "done"
    if step[0] == "flaky":
        needed = step[1] + 1
        return "done" if needed <= max_attempts - lost else "dead" if needed > max_attempts else "either"
    return "dead"


def hexed(text):
    return text if text == HUGE else text.encode("utf-8", "surrogatepass").hex()


def text(hex_text):
    return "x" * (1 << 20) if hex_text == HUGE else bytes.fromhex(hex_text).decode("utf-8", "surrogatepass")


def payload(index, step):
    """The payload of job index, whose work does what step says."""
    if step[0] == UNDECODABLE:
        return UNDECODABLE_PAYLOAD
    if step[0] in ("raise", ODD_RESULT):
        step = step[:-1] + (hexed(step[-1]),)
    return json.dumps({"i": index, "do": list(step)})


def work(job_payload, attempts, runs):
    """Do what the payload says, at the job's attempt (1 for the first); its result. A job whose work
    succeeds appends its index to the file runs: one write of a short line, whole whatever runs beside it."""
    asked = json.loads(job_payload)  # an undecodable payload fails here, in its job
    kind, rest = asked["do"][0], asked["do"][1:]
    if kind == "flood":
        sys.stdout.write("o" * (1 << 20))
        sys.stderr.write("e" * (1 << 20))
    elif kind == "flaky" and attempts <= rest[0]:
        raise ConnectionError("down for attempt %d" % attempts)
    elif kind == "raise":
        raise EXCEPTIONS[rest[0]](text(rest[1]))
    elif kind == "notjson":
        return NOT_JSON[rest[0]]()
    elif kind == ODD_RESULT:
        return text(rest[0])
    elif kind == "segv":
        faulthandler.disable()  # a stand-in crash: no stack dump, no core file
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "hang":
        time.sleep(HANG_SECONDS)
    with open(runs, "a") as handle:
        handle.write("%d\n" % asked["i"])
    return {"i": asked["i"]}


def make_process(runs, payload_of=lambda job: job.payload):
    """The process(job) of a consumer whose jobs do what their payloads say; payload_of reads a
    job's payload (a spool job's is the path of its file)."""
    def process(job):
        return work(payload_of(job), job.attempts, runs)
    return process
