"""A property of batchq-sqs against SQS on a moto server: a batch SIGKILLed
at a drawn point of a drawn job's drawn attempt loses no job and applies no
result twice.

Hypothesis draws the jobs (how many attempts each fails before it
succeeds; a job that fails them all is poison), --limit, --max-attempts and
the kill: job i's attempt a, at one of three points. "claim": just after the
batch received it, before any work; "work": while its work runs (its worker
kills the batch); "outcome": just after done(), failed() or dead() (the
result stored or the copy sent, the delete still buffered). Each batch runs
in a child process of the test, on a client of its own, so the kill is a real
SIGKILL and SQS keeps what the batch had done.

Then, as the contract says: every message leaves the queue; a poison job is
dead, never done; a job that can succeed is done, unless the kill cost it
the attempt it needed; a done job has one result and its work succeeded
once; a dead job has no result, and one copy in the dead-letter queue, or
two when the kill came just after its copy was sent; no job's work ran more
than --max-attempts times."""

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid

import boto3
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import batchq_queue
import batchq_sqs
from conftest import parsed_options

REGION = "us-east-1"
# Short, so that a killed batch's messages come back soon; long enough that a batch of
# quick jobs never needs its renewals (they come every 2.5 s).
VISIBILITY = 5
POINTS = ["claim", "work", "outcome"]

plan = st.fixed_dictionaries({
    "fails": st.lists(st.integers(0, 3), min_size=1, max_size=5),
    "limit": st.integers(1, 4),
    "max_attempts": st.integers(1, 3),
    "kill": st.tuples(st.integers(0, 4), st.integers(1, 3), st.sampled_from(POINTS)),
})


def note(path, record):
    """Append one JSON line: one short write, whole whatever else writes there."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def records(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def make_process(fails, kill, folder):
    def process(job):
        index = json.loads(job.payload)["i"]
        note(os.path.join(folder, "runs"), {"i": index, "attempt": job.attempts, "how": "started"})
        if (index, job.attempts, "work") == kill:
            note(os.path.join(folder, "kills"), {"i": index, "point": "work"})
            os.kill(os.getppid(), signal.SIGKILL)  # the batch; this worker follows it (PR_SET_PDEATHSIG)
            time.sleep(60)
        if job.attempts <= fails[index]:
            raise ConnectionError("down for attempt %d" % job.attempts)
        note(os.path.join(folder, "runs"), {"i": index, "attempt": job.attempts, "how": "succeeded"})
        return {"i": index}
    return process


class Killable(batchq_sqs.SQSBackend):
    """The SQS backend, SIGKILLed at the drawn point."""

    def __init__(self, kill, folder, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kill = kill
        self.folder = folder

    def die_at(self, job, point, outcome=None):
        if (json.loads(job.payload)["i"], job.attempts, point) == self.kill:
            note(os.path.join(self.folder, "kills"), {"i": self.kill[0], "point": outcome or point})
            os.kill(os.getpid(), signal.SIGKILL)

    def claim(self, limit):
        jobs = super().claim(limit)
        note(os.path.join(self.folder, "claims"), [[json.loads(job.payload)["i"], job.attempts] for job in jobs])
        for job in jobs:
            self.die_at(job, "claim")
        return jobs

    def done(self, job, result):
        super().done(job, result)
        self.die_at(job, "outcome", "done")

    def failed(self, job, error, delay):
        super().failed(job, error, delay)
        self.die_at(job, "outcome", "failed")

    def dead(self, job, error):
        super().dead(job, error)
        self.die_at(job, "outcome", "dead")


def batch(endpoint, url, folder, args, case, kill):
    """One batch in a child process: its wait status."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            sqs = boto3.client("sqs", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                               aws_secret_access_key="testing")
            backend = Killable(kill, folder, sqs, url, os.path.join(folder, "results"), VISIBILITY, 1)
            assert backend.setup(args.max_attempts) is None
            code = batchq_queue.run_batch(backend, make_process(case["fails"], kill, folder), args)
        except BaseException:  # pylint: disable=broad-except  # the test's parent says the exit code
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def counts(sqs, url):
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def drain(sqs, endpoint, url, folder, args, case, kill):
    """Batches until the queue is empty: their wait statuses."""
    statuses = []
    deadline = time.monotonic() + 120
    while counts(sqs, url):
        assert time.monotonic() < deadline, "not drained in 120 s: %s" % statuses
        status = batch(endpoint, url, folder, args, case, kill)
        assert (os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 1, 75)) or (
            os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL), status
        statuses.append(status)
    return statuses


def check(case, folder, dead_copies):
    """The contract, judged from the results folder, the dead-letter queue and what the batches noted."""
    fails, most = case["fails"], case["max_attempts"]
    results = {}
    for name in os.listdir(os.path.join(folder, "results")):
        if name.endswith(".json"):
            with open(os.path.join(folder, "results", name), encoding="utf-8") as handle:
                index = json.load(handle)["i"]
            results[index] = results.get(index, 0) + 1
    kills = records(os.path.join(folder, "kills"))
    assert len(kills) <= 1, kills
    # The jobs the killed batch held: the kill may have cost each of them an attempt.
    claims = records(os.path.join(folder, "claims"))
    held = set()
    if kills:
        killed = next(claim for claim in claims if [kills[0]["i"], case["kill"][1]] in claim)
        held = {index for index, _attempt in killed}
    runs = records(os.path.join(folder, "runs"))
    for index, failing in enumerate(fails):
        started = [run for run in runs if run["i"] == index and run["how"] == "started"]
        succeeded = [run for run in runs if run["i"] == index and run["how"] == "succeeded"]
        assert len(started) <= most, (index, started)
        done, copies = results.get(index, 0), dead_copies.get(index, 0)
        assert done <= 1 and (done == 1) != (copies > 0), (index, done, copies)
        if done:
            assert len(succeeded) == 1, (index, succeeded)
        else:
            assert succeeded == [], (index, succeeded)
            # A batch deletes its done and dead messages 10 at a time, and the rest at its end: a job
            # that the killed batch made dead may have been copied with its delete not yet sent. Its
            # next delivery finds its attempts spent and copies it again.
            assert copies == 1 or (copies == 2 and index in held), (index, copies, kills, held)
        if failing >= most:
            assert not done, (index, "poison, yet done")
        elif index not in held or failing + 2 <= most:
            assert done, (index, "could succeed, yet dead", kills, claims)


def run_case(sqs, endpoint, case):
    fails = case["fails"]
    kill = (case["kill"][0] % len(fails),) + tuple(case["kill"][1:])
    case = dict(case, kill=kill)
    name = uuid.uuid4().hex[:12]
    dlq = sqs.create_queue(QueueName="dlq-" + name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    # Receives beyond --max-attempts: the attempt a kill costs, and the second copy's delivery.
    url = sqs.create_queue(QueueName="jobs-" + name, Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": arn, "maxReceiveCount": str(case["max_attempts"] + 3)})})["QueueUrl"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": json.dumps({"i": i})}
                                                  for i in range(len(fails))])
    args = parsed_options(dict(backoff_min=0.0, backoff_max=0.0, job_timeout=30.0),
                          dict(limit=case["limit"], max_attempts=case["max_attempts"]))
    folder = tempfile.mkdtemp()
    try:
        drain(sqs, endpoint, url, folder, args, case, kill)
        copies = {}
        while True:
            got = sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10, VisibilityTimeout=600).get(
                "Messages", [])
            if not got:
                break
            for message in got:
                index = json.loads(message["Body"])["i"]
                copies[index] = copies.get(index, 0) + 1
        check(case, folder, copies)
    finally:
        shutil.rmtree(folder)
        for queue in (url, dlq):
            sqs.delete_queue(QueueUrl=queue)


def test_a_batch_killed_anywhere_loses_no_job_and_applies_no_result_twice(moto_url):
    sqs = boto3.client("sqs", endpoint_url=moto_url, region_name=REGION, aws_access_key_id="testing",
                       aws_secret_access_key="testing")

    # Few examples: a kill costs VISIBILITY seconds of waiting for its messages.
    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(plan)
    @example({"fails": [0, 0, 5], "limit": 3, "max_attempts": 2, "kill": (0, 1, "claim")})
    @example({"fails": [1, 0], "limit": 2, "max_attempts": 3, "kill": (0, 2, "work")})
    @example({"fails": [0, 1], "limit": 2, "max_attempts": 2, "kill": (0, 1, "outcome")})
    @example({"fails": [3, 0], "limit": 1, "max_attempts": 2, "kill": (0, 2, "outcome")})
    @example({"fails": [0, 0, 0, 1, 0], "limit": 3, "max_attempts": 1, "kill": (4, 1, "work")})
    def run(case):
        run_case(sqs, moto_url, case)

    run()
