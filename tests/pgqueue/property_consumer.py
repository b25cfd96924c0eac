"""A consumer of batchq_pgqueue whose jobs do what their payload says, for test_property.py.

Built as the writing guide says a consumer of your own is: the library and
the backend from /usr/local/lib/batchq-queue, process(job) of its own. The
jobs are those of the queue library's property model (tests/queues/property_model.py,
copied beside the library): each job done appends its index to PROPERTY_RUNS.

PROPERTY_FAULT ("kill:N" or "drop:N") strikes once, at the N-th job started
(PROPERTY_STARTS counts them): the batch's process is SIGKILLed, or its
database session terminated (the job then goes on as its payload says). Just
before, the job writes to PROPERTY_FAULT_FILE what was done by then: the
indexes of PROPERTY_RUNS, and the done jobs of the queue as the table has them.
"""

import json
import os
import signal
import sys
import time

sys.path.insert(0, "/usr/local/lib/batchq-queue")

import batchq_pgqueue  # noqa: E402
import property_model  # noqa: E402


# The batch's process: the jobs run in its children.
BATCH_PID = os.getpid()


def index_of(job):
    try:
        return json.loads(job.payload)["i"]
    except Exception:  # pylint: disable=broad-except  # an undecodable payload, or no object
        return None


def fault(job, queue, runs):
    """PROPERTY_FAULT, when this job is the N-th started."""
    kind, _colon, at = os.environ.get("PROPERTY_FAULT", "").partition(":")
    if not kind:
        return
    with open(os.environ["PROPERTY_STARTS"], "a+") as handle:
        handle.write("%s\n" % job.id)
        handle.seek(0)
        if len(handle.read().split()) != int(at):
            return
    conn = batchq_pgqueue.psycopg.connect(os.environ.get("BATCHQ_PG_DSN", ""), **dict(
        batchq_pgqueue.connection_options(), application_name="property-fault"))
    conn.autocommit = True
    cursor = conn.cursor()
    cursor.execute("SELECT (payload->>'i')::int, done_by, attempts FROM batchq_jobs WHERE queue = %s "
                   "AND state = 'done' ORDER BY 1", (queue,))
    done = [list(row) for row in cursor.fetchall()]
    with open(runs) as handle:
        ran = sorted(int(index) for index in handle.read().split())
    with open(os.environ["PROPERTY_FAULT_FILE"], "w") as handle:
        json.dump({"kind": kind, "index": index_of(job), "runs": ran, "done": done}, handle)
    if kind == "kill":
        os.kill(BATCH_PID, signal.SIGKILL)
        os._exit(0)
    name = batchq_pgqueue.batch_name()[:63]
    cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (name,))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,))
        if cursor.fetchone()[0] == 0:
            break
        time.sleep(0.05)
    conn.close()


def make_process(args):
    runs = os.environ["PROPERTY_RUNS"]

    def process(job):
        fault(job, args.queue, runs)
        return property_model.work(job.payload, job.attempts, runs)
    return process


if __name__ == "__main__":
    sys.exit(batchq_pgqueue.main(sys.argv[1:], make_process))
