"""The queue library's property test (tests/queues/test_property.py) against
PostgreSQL, with psycopg2 and psycopg 3: hypothesis draws jobs that succeed,
fail for a while, raise any exception with any text (NUL, lone surrogates,
1 MB), return what JSON cannot hold or a text PostgreSQL refuses, die by
SIGSEGV, hang past --job-timeout, flood their output, or have a payload
Python cannot decode; and at times a fault at a drawn job: the batch is
SIGKILLed, or its session terminated (pg_terminate_backend). The batches of
property_consumer.py drain them: every job ends done with its result applied
exactly once, or dead after exactly --max-attempts; no job that could succeed
goes dead; the jobs done before the fault stay done as they were, and it cost
a job one attempt at most. A job whose outcome was held to commit with
others' (--commit-delay) when the fault struck runs once more. Few examples: each drain is a few batches in a
client container."""

import json
import pathlib
import uuid

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import property_model
from conftest import LIBRARY_DIR, QUEUE_TESTS, docker, sql
from property_model import ending, payload

CONSUMER = pathlib.Path(__file__).with_name("property_consumer.py")
PROGRAM = "/usr/local/bin/batchq-property.py"
JOB_TIMEOUT = 1  # a hang costs this much per attempt; the other jobs end in milliseconds
# The model's kinds and PostgreSQL's own: a result its text type refuses, a payload Python cannot decode.
plan = property_model.plan(kinds=property_model.KINDS + (property_model.ODD_RESULT, property_model.UNDECODABLE),
                           max_jobs=5, faults=("kill", "drop"))
# --commit-delay: each outcome at once (0), or done jobs' outcomes held to commit together (the default).
# A case without it has the default.
DEFAULT_DELAY = 0.2
plan = st.builds(lambda case, delay: dict(case, commit_delay=delay), plan, st.sampled_from([0.0, DEFAULT_DELAY]))


def attempts_of(case):
    """--max-attempts of the drain: one more with a fault, which may cost a job one attempt."""
    return case["max_attempts"] + (1 if case["fault"] else 0)


def drain(client, queue, case):
    """Batches until one exits 0 (with no backoff, it then left nothing due), at most a bound of them:
    every batch but the last ends at least one attempt, or is the one of the fault. Their exit codes.
    Each batch has a name of its own (BATCHQ_BATCH; BATCHQ_CONSUMER is the queue's name)."""
    bound = len(case["jobs"]) * attempts_of(case) + 4
    fault = "%s:%d" % (case["fault"][0], min(case["fault"][1], len(case["jobs"]))) if case["fault"] else ""
    script = """cd /tmp/{q} && for n in $(seq {bound}); do
        BATCHQ_CONSUMER={q} BATCHQ_BATCH=$n PROPERTY_RUNS=/tmp/{q}/runs PROPERTY_FAULT={fault} \\
        PROPERTY_STARTS=/tmp/{q}/starts PROPERTY_FAULT_FILE=/tmp/{q}/fault.json \\
          python3 {program} --queue {q} --limit {limit} --max-attempts {attempts} \\
          --backoff-min 0 --backoff-max 0 --job-timeout {timeout} --commit-delay {delay} >>out 2>&1
        code=$?; echo $code; if [ $code = 0 ]; then break; fi
    done""".format(q=queue, bound=bound, program=PROGRAM, limit=case["limit"], attempts=attempts_of(case),
                   timeout=JOB_TIMEOUT, fault=fault, delay=case.get("commit_delay", DEFAULT_DELAY))
    # as a worker's unit runs it: libpq's environment of conftest.ENVIRONMENT
    return [int(code) for code in docker(*client.argv("/bin/sh", ["-c", script], {}, None)).stdout.split()]


def run_case(client, case):
    jobs, max_attempts = case["jobs"], attempts_of(case)
    queue = "property-%s-%s" % (client.driver, uuid.uuid4().hex[:8])
    client.shell("mkdir -p /tmp/%s && touch /tmp/%s/runs" % (queue, queue))
    sql("INSERT INTO batchq_jobs (queue, payload) VALUES %s"
        % ", ".join("('%s', '%s')" % (queue, payload(i, step)) for i, step in enumerate(jobs)))
    codes = drain(client, queue, case)
    killed = {137} if case["fault"] and case["fault"][0] == "kill" else set()
    if codes[-1] != 0 or not set(codes) <= {0, 1, 75} | killed:
        raise AssertionError("exit codes %s; the batches' last words:\n%s"
                             % (codes, client.shell("tail -c 3000 /tmp/%s/out" % queue)))
    rows = sql("SELECT j.state, j.attempts, length(coalesce(j.last_error, '')), count(r.job_id), j.done_by "
               "FROM batchq_jobs j LEFT JOIN batchq_results r ON r.job_id = j.id WHERE j.queue = '%s' "
               "GROUP BY j.id ORDER BY j.id" % queue).splitlines()
    runs = client.shell("cat /tmp/%s/runs" % queue).split()
    assert len(rows) == len(jobs), rows
    fault = check_fault(client, queue, case, rows)
    for index, (step, row) in enumerate(zip(jobs, rows)):
        state, attempts, error_chars, results, _done_by = row.split("|")
        wanted = ending(step, max_attempts, 1 if case["fault"] else 0)
        assert state == wanted or (wanted == "either" and state in ("done", "dead")), (step, row)
        # The job whose work dropped its batch's session went on, and ran once more in a later batch.
        # So did a job whose outcome was held to commit with others' when the fault struck.
        again = 1 if (fault.get("kind") == "drop" and fault["index"] == index) or index in fault.get("held", ()) else 0
        if state == "done":
            assert results == "1", (step, row)
            assert runs.count(str(index)) - 1 in range(again + 1), (step, runs)
        else:
            assert (state, int(attempts), results) == ("dead", max_attempts, "0"), (step, row)
            assert 0 < int(error_chars) <= 2000 and runs.count(str(index)) <= again, (step, row, runs)
    client.shell("rm -rf /tmp/%s" % queue)


def check_fault(client, queue, case, rows):
    """What the fault's job saw: every job done by then is done still, by the same batch, after the
    same attempts. Every job whose work ran by then was done by then, but for the outcomes held to
    commit together (fault["held"]: each may run once more). {} without a fault."""
    if not case["fault"]:
        return {}
    fault = json.loads(client.shell("cat /tmp/%s/fault.json" % queue))
    done = [index for index, _by, _attempts in fault["done"]]
    fault["held"] = sorted(set(fault["runs"]) - set(done))
    assert set(done) <= set(fault["runs"]) and len(done) == len(set(done)), fault
    if case.get("commit_delay", DEFAULT_DELAY) == 0:
        assert fault["held"] == [], fault
    for index, done_by, attempts in fault["done"]:
        state, now_attempts, _chars, results, now_by = rows[index].split("|")
        assert (state, int(now_attempts), results, now_by) == ("done", attempts, "1", done_by), (fault, rows[index])
    return fault


def test_every_job_is_done_once_or_dead_after_max_attempts(client):
    docker("cp", str(CONSUMER), "%s:%s" % (client.name, PROGRAM))
    # beside the library, where the consumer imports it from
    docker("cp", str(QUEUE_TESTS / "property_model.py"), "%s:%s/property_model.py" % (client.name, LIBRARY_DIR))

    # Failing examples are kept, and tried first the next time (HYPOTHESIS_STORAGE_DIRECTORY, set by make).
    @settings(max_examples=10, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(plan)
    @example({"jobs": [("raise", 0, "a NUL \x00 byte"), ("ok",), ("raise", 8, "\ud800"), ("undecodable",),
                       ("oddresult", "a lone \udcff surrogate"), ("ok",)], "limit": 6, "max_attempts": 1,
              "fault": None})
    @example({"jobs": [("hang",), ("segv",), ("flood",), ("flaky", 1)], "limit": 4, "max_attempts": 2,
              "fault": None})
    # Found by hypothesis in CI: a job that failed with no backoff was not "more work waiting"
    # (the check compared with the batch's start), and the drain ended with it queued.
    @example({"jobs": [("ok",), ("flaky", 2)], "limit": 3, "max_attempts": 2, "fault": None})
    # A batch killed, and a batch whose session is dropped, at its third job: the two before stay done
    # (each outcome at once), or those whose outcome committed stay done (held to commit together).
    @example({"jobs": [("ok",), ("flaky", 1), ("ok",), ("ok",)], "limit": 4, "max_attempts": 1,
              "fault": ("kill", 3), "commit_delay": 0.0})
    @example({"jobs": [("ok",), ("ok",), ("ok",), ("segv",)], "limit": 4, "max_attempts": 1,
              "fault": ("drop", 3), "commit_delay": 0.0})
    @example({"jobs": [("ok",), ("ok",), ("ok",), ("ok",)], "limit": 4, "max_attempts": 1,
              "fault": ("kill", 3), "commit_delay": DEFAULT_DELAY})
    def run(case):
        run_case(client, case)

    run()
