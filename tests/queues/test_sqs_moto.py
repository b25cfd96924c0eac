"""batchq-sqs and batchq-sqs-enqueue, as programs, against a moto server on
127.0.0.1: a drain with poison jobs ends with every job done once or in the
dead-letter queue after exactly --max-attempts; a queue without a fitting
redrive policy is refused at start."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid

import boto3
import pytest

from conftest import SQS, TOP

REGION = "us-east-1"


@pytest.fixture
def sqs(moto_url, credentials):
    return boto3.client("sqs", endpoint_url=moto_url, region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def make_queues(sqs, fifo=False, max_receive=5, redrive=True):
    suffix = ".fifo" if fifo else ""
    name = uuid.uuid4().hex[:12]
    attributes = {"FifoQueue": "true"} if fifo else {}
    dlq = sqs.create_queue(QueueName="dlq-" + name + suffix, Attributes=attributes)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    if redrive:
        attributes = dict(attributes, RedrivePolicy=json.dumps({"deadLetterTargetArn": arn,
                                                                "maxReceiveCount": str(max_receive)}))
    url = sqs.create_queue(QueueName="jobs-" + name + suffix, Attributes=attributes)["QueueUrl"]
    return url, dlq


def program(name, *argv, moto_url):
    return subprocess.run([sys.executable, os.path.join(SQS, name), "--endpoint-url", moto_url,
                           "--region", REGION] + [str(arg) for arg in argv],
                          capture_output=True, text=True, check=False, timeout=120)


def left(sqs, url):
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def drain(sqs, url, results, moto_url, max_attempts, runs=80, **more):
    """Run batches until one exits 0 on an empty queue; the batches' counts, added."""
    extra = [part for key, value in more.items() for part in ("--" + key.replace("_", "-"), value)]
    totals = {"done": 0, "dead": 0, "failed": 0}
    codes = []
    for _round in range(runs):
        batch = program("batchq-sqs", "--queue-url", url, "--max-attempts", max_attempts, "--backoff-min", 0,
                        "--backoff-max", 0, "--visibility-timeout", 10, "--wait-seconds", 1,
                        "--results", results, "--job-timeout", 20, *extra, moto_url=moto_url)
        codes.append(batch.returncode)
        assert batch.returncode in (0, 1, 75), batch.stderr
        counts = json.loads(batch.stderr.rsplit("batchq: batch ", 1)[1].split(", exit")[0])
        for key in totals:
            totals[key] += counts[key]
        if batch.returncode == 0 and left(sqs, url) == 0:
            return totals, codes
    raise AssertionError("not drained after %d batches: %s" % (runs, codes))


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_a_drain_with_poison_jobs(sqs, moto_url, tmp_path, fifo):
    count, crashing, raising, max_attempts = (24, 2, 2, 3) if not fifo else (12, 1, 1, 3)
    url, dlq = make_queues(sqs, fifo=fifo, max_receive=max_attempts + 2)
    sent = program("batchq-sqs-enqueue", count, "--queue-url", url, "--crashing", crashing, "--raising", raising,
                   *(["--fifo-groups", 3] if fifo else []), moto_url=moto_url)
    assert sent.returncode == 0, sent.stderr
    results = tmp_path / "results"
    totals, codes = drain(sqs, url, results, moto_url, max_attempts, limit=10)
    poison = crashing + raising
    assert totals["done"] == count - poison  # each good job done once
    assert totals["dead"] == poison
    assert totals["failed"] == poison * (max_attempts - 1)  # each poison job: exactly max_attempts attempts
    assert len(os.listdir(results)) == count - poison
    bodies = [json.loads(open(results / name).read()) for name in os.listdir(results)]
    assert all(set(body) == {"job", "bytes"} for body in bodies)
    dead = sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10, MessageAttributeNames=["All"],
                               WaitTimeSeconds=1)["Messages"]
    assert len(dead) == poison
    for message in dead:
        payload = json.loads(message["Body"])
        assert payload.get("crash") or payload.get("raise")
        assert message["MessageAttributes"]["batchq-attempts"]["StringValue"] == str(max_attempts)
    # The first batch claims 10 (or, FIFO, a group's head each) and leaves work: a backlog.
    assert codes[0] == 75 and codes[-1] == 0


@pytest.mark.parametrize("redrive, max_receive", [(False, 5), (True, 3)])
def test_a_queue_without_a_fitting_redrive_policy_is_refused_at_start(sqs, moto_url, tmp_path, redrive, max_receive):
    url, _dlq = make_queues(sqs, max_receive=max_receive, redrive=redrive)
    sqs.send_message(QueueUrl=url, MessageBody="{}")
    batch = program("batchq-sqs", "--queue-url", url, "--max-attempts", 3, "--results", tmp_path,
                    moto_url=moto_url)
    assert batch.returncode == 2, batch.stderr
    assert "redrive" in batch.stderr
    assert left(sqs, url) == 1  # nothing claimed
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"][
        "ApproximateNumberOfMessages"] == "1"


def test_an_unreachable_queue_is_exit_1(moto_url, tmp_path, credentials):
    batch = program("batchq-sqs", "--queue-url", moto_url + "/123456789012/missing", "--results", tmp_path,
                    moto_url=moto_url)
    assert batch.returncode == 1, batch.stderr


def test_the_guides_consumer_runs_as_written(sqs, moto_url, tmp_path):
    """The 15-line consumer of the writing guide ("An SQS queue"), with the two modules copied where it looks."""
    guide = open(os.path.join(TOP, "docs", "docsite", "rst", "guide_writing.rst"), encoding="utf-8").read()
    section = guide.split("An SQS queue\n====")[1]
    block = section.split(".. code-block:: python\n\n")[1].split("\n\n.. ")[0]
    code = "\n".join(line[3:] for line in block.splitlines())
    assert 12 <= len(code.splitlines()) <= 16
    library = tmp_path / "lib"
    library.mkdir()
    shutil.copy(os.path.join(TOP, "examples", "queue_library", "batchq_queue.py"), library)
    shutil.copy(os.path.join(SQS, "batchq_sqs.py"), library)
    assert '"/usr/local/lib/batchq"' in code
    consumer = tmp_path / "consumer"
    consumer.write_text(code.replace('"/usr/local/lib/batchq"', repr(str(library))))
    url, _dlq = make_queues(sqs, max_receive=6)  # above the default --max-attempts, 5
    sqs.send_message(QueueUrl=url, MessageBody="hello")
    done = subprocess.run([sys.executable, str(consumer), "--queue-url", url, "--endpoint-url", moto_url,
                           "--region", REGION, "--results", str(tmp_path / "results"), "--wait-seconds", "1"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    result, = os.listdir(tmp_path / "results")
    assert json.loads((tmp_path / "results" / result).read_text()) == {
        "sha256": hashlib.sha256(b"hello").hexdigest()}
    assert left(sqs, url) == 0
