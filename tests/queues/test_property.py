"""A property test of the contract: hypothesis draws jobs that succeed, fail
for a while, raise any exception with any text (NUL and the other control
characters, U+FFFF, lone surrogates, 1 MB),
return what JSON cannot hold, die by SIGSEGV, hang past --job-timeout or
flood their output. Run against the in-memory backend, against SQS on a
moto server and against a spool directory, every job ends done exactly once, or dead after exactly
--max-attempts; no job that could succeed goes dead; the drain takes a
bounded number of batches. The jobs, what they do and how each must end are
the model of property_model.py, which tests/pgqueue/test_property.py runs
against PostgreSQL."""

import json
import os
import shutil
import tempfile
import uuid

import boto3
from hypothesis import HealthCheck, example, given, settings

import batchq_queue
import batchq_spool
import batchq_sqs
import property_model
from conftest import parsed_options
from property_model import ending

TIMEOUT = 0.5  # a hang costs this much per attempt; the other jobs end in milliseconds
plan = property_model.plan()


def options(limit, max_attempts):
    return parsed_options({"backoff_min": 0.0, "backoff_max": 0.0, "job_timeout": TIMEOUT},
                          {"limit": limit, "max_attempts": max_attempts})


def drain(backend, jobs, args, log, empty, payload=lambda job: job.payload):
    """Batches until empty(). backend is the queue, or a function that makes each batch's (the spool's)."""
    process = property_model.make_process(log, payload)
    bound = len(jobs) * args.max_attempts + 3  # every batch but the last makes progress
    for batches in range(1, bound + 1):
        code = batchq_queue.run_batch(backend() if callable(backend) else backend, process, args)
        assert code in (0, 1, 75)
        if code == 0 and empty():
            return batches
    raise AssertionError("not drained in %d batches" % bound)


def innocent(step, max_attempts):
    """Whether the job of step succeeds within max_attempts: it must end done."""
    return ending(step, max_attempts) == "done"


def check_runs(jobs, max_attempts, log):
    with open(log) as handle:
        runs = [int(line) for line in handle]
    for index, step in enumerate(jobs):
        assert runs.count(index) == (1 if innocent(step, max_attempts) else 0), (index, step)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan)
@example({"jobs": [("raise", 3, "\ud800"), ("ok",)], "limit": 1, "max_attempts": 1})
@example({"jobs": [("hang",), ("segv",), ("flood",)], "limit": 4, "max_attempts": 2})
def test_every_job_done_once_or_dead_after_max_attempts_in_memory(case):
    jobs, max_attempts = case["jobs"], case["max_attempts"]
    folder = tempfile.mkdtemp()
    try:
        log = os.path.join(folder, "runs")
        open(log, "w").close()
        backend = batchq_queue.MemoryBackend([property_model.payload(i, step) for i, step in enumerate(jobs)])
        drain(backend, jobs, options(case["limit"], max_attempts), log,
              lambda: all(job["state"] in ("done", "dead") for job in backend.jobs.values()))
        for index, step in enumerate(jobs):
            job = backend.jobs[index]
            if innocent(step, max_attempts):
                assert job["state"] == "done" and len(job["results"]) == 1, (step, job)
            else:
                assert job["state"] == "dead" and job["attempts"] == max_attempts, (step, job)
                assert len(job["error"]) <= batchq_queue.ERROR_CHARS and not batchq_queue.UNSAFE.search(job["error"])
                job["error"].encode("utf-8")
        check_runs(jobs, max_attempts, log)
    finally:
        shutil.rmtree(folder)


def test_on_sqs(moto_url):
    """The same property against SQS on moto, with fewer examples (each drain ends on a long poll)."""
    sqs = boto3.client("sqs", endpoint_url=moto_url, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(plan)
    @example({"jobs": [("segv",), ("flaky", 1), ("ok",)], "limit": 2, "max_attempts": 2})
    def run(case):
        jobs, max_attempts = case["jobs"], case["max_attempts"]
        name = uuid.uuid4().hex[:12]
        dlq = sqs.create_queue(QueueName="dlq-" + name)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        url = sqs.create_queue(QueueName="jobs-" + name, Attributes={"RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": arn, "maxReceiveCount": str(max_attempts + 2)})})["QueueUrl"]
        for start in range(0, len(jobs), 10):
            sqs.send_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "MessageBody": property_model.payload(i, jobs[i])}
                for i in range(start, min(start + 10, len(jobs)))])
        folder = tempfile.mkdtemp()
        try:
            log = os.path.join(folder, "runs")
            open(log, "w").close()
            backend = batchq_sqs.SQSBackend(sqs, url, os.path.join(folder, "results"), 10, 1)
            assert backend.setup(max_attempts) is None

            def empty():
                attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
                counts = (attributes["ApproximateNumberOfMessages"], attributes["ApproximateNumberOfMessagesNotVisible"])
                return counts == ("0", "0")

            drain(backend, jobs, options(case["limit"], max_attempts), log, empty)
            results = sorted(json.load(open(os.path.join(folder, "results", name)))["i"]
                             for name in os.listdir(os.path.join(folder, "results")) if name.endswith(".json"))
            assert results == [i for i, step in enumerate(jobs) if innocent(step, max_attempts)]
            dead = []
            while True:
                got = sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10, MessageAttributeNames=["All"],
                                          VisibilityTimeout=60).get("Messages", [])
                if not got:
                    break
                dead += got
            assert sorted(json.loads(m["Body"])["i"] for m in dead) == [
                i for i, step in enumerate(jobs) if not innocent(step, max_attempts)]
            assert all(m["MessageAttributes"]["batchq-attempts"]["StringValue"] == str(max_attempts) for m in dead)
            check_runs(jobs, max_attempts, log)
        finally:
            shutil.rmtree(folder)

    run()


def read(job):
    with open(job.payload) as handle:
        return handle.read()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan)
@example({"jobs": [("hang",), ("segv",), ("flaky", 1), ("ok",)], "limit": 2, "max_attempts": 2})
def test_on_a_spool(case):
    """The same property on a spool directory: each file's result in done/ once, the others in failed/."""
    jobs, max_attempts = case["jobs"], case["max_attempts"]
    folder = tempfile.mkdtemp()
    try:
        log = os.path.join(folder, "runs")
        open(log, "w").close()
        spool = os.path.join(folder, "spool")
        for name in batchq_spool.FOLDERS:
            os.makedirs(os.path.join(spool, name))
        for index in range(len(jobs)):
            with open(os.path.join(spool, "incoming", "job-%d" % index), "w") as handle:
                handle.write(property_model.payload(index, jobs[index]))
        args = options(case["limit"], max_attempts)
        args.spool, args.records_bytes = spool, 1 << 20

        def empty():
            return not os.listdir(os.path.join(spool, "incoming")) and not os.listdir(os.path.join(spool, "claims"))

        drain(lambda: batchq_spool.SpoolBackend(args), jobs, args, log, empty, read)
        done = {name: json.load(open(os.path.join(spool, "done", name))) for name in os.listdir(os.path.join(spool, "done"))}
        assert sorted(done) == sorted("job-%d" % i for i, step in enumerate(jobs) if innocent(step, max_attempts))
        assert all(result["i"] == int(name[4:]) for name, result in done.items())
        assert sorted(os.listdir(os.path.join(spool, "failed"))) == sorted(
            "job-%d~%d" % (i, max_attempts) for i, step in enumerate(jobs) if not innocent(step, max_attempts))
        check_runs(jobs, max_attempts, log)
    finally:
        shutil.rmtree(folder)
