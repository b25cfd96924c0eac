"""batchq-sqs and batchq-sqs-enqueue, as programs, against a moto server on
127.0.0.1: a drain with poison jobs ends with every job done once or in the
dead-letter queue after exactly --max-attempts; a queue without a fitting
redrive policy is refused at start; two consumers that share a DynamoDB
results table (moto serves it too) store each message's result once, though
SQS delivers a message to both. The same runs under Debian 11's boto3 1.13
and botocore 1.20 (DEBIAN11_PYTHON, a venv make queues builds)."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import boto3
import pytest

from conftest import SQS, TOP, guide_consumer

REGION = "us-east-1"
# The python of a venv with Debian 11's boto3 and botocore (requirements/queues-debian11.txt).
DEBIAN11_PYTHON = os.environ.get("DEBIAN11_PYTHON")
PYTHONS = [pytest.param(sys.executable, id="boto3-" + boto3.__version__),
           pytest.param(DEBIAN11_PYTHON, id="debian11-boto3", marks=pytest.mark.skipif(
               not DEBIAN11_PYTHON, reason="DEBIAN11_PYTHON is not set (make queues sets it)"))]


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


def command(name, argv, moto_url, python=None):
    return [python or sys.executable, os.path.join(SQS, name), "--endpoint-url", moto_url,
            "--region", REGION] + [str(arg) for arg in argv]


def program(name, *argv, moto_url, python=None):
    return subprocess.run(command(name, argv, moto_url, python), capture_output=True, text=True, check=False,
                          timeout=120)


def make_table(moto_url, key="message_id"):
    dynamodb = boto3.client("dynamodb", endpoint_url=moto_url, region_name=REGION,
                            aws_access_key_id="testing", aws_secret_access_key="testing")
    name = "results-" + uuid.uuid4().hex[:12]
    dynamodb.create_table(TableName=name, KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
                          AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
                          BillingMode="PAY_PER_REQUEST")
    return dynamodb, name


def table_results(dynamodb, name):
    """{message id: the result's JSON, parsed} of every item of the table."""
    items, params = [], {"TableName": name, "ConsistentRead": True}
    while True:
        page = dynamodb.scan(**params)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            return {item["message_id"]["S"]: json.loads(item["result"]["S"]) for item in items}
        params["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def counts_of(stderr):
    """The counts of every batch in a consumer's stderr, added."""
    totals = {}
    for line in stderr.splitlines():
        if line.startswith("batchq: batch "):
            for key, value in json.loads(line[len("batchq: batch "):].split(", exit")[0]).items():
                totals[key] = totals.get(key, 0) + value
    return totals


def wait_for(condition, what, seconds=30):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("not within %d s: %s" % (seconds, what))
        time.sleep(0.1)


def left(sqs, url):
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def drain(sqs, url, results, moto_url, max_attempts, runs=80, python=None, **more):
    """Run batches until one exits 0 on an empty queue: the batches' counts, added, their exit codes and
    their stderr. results is a folder, or ("table", NAME) for a results table."""
    extra = [part for key, value in more.items() for part in ("--" + key.replace("_", "-"), value)]
    if isinstance(results, tuple):
        extra += ["--results-table", results[1], "--table-endpoint-url", moto_url]
    else:
        extra += ["--results", results]
    totals = {"done": 0, "dead": 0, "failed": 0}
    codes = []
    said = ""
    for _round in range(runs):
        batch = program("batchq-sqs", "--queue-url", url, "--max-attempts", max_attempts, "--backoff-min", 0,
                        "--backoff-max", 0, "--visibility-timeout", 10, "--wait-seconds", 1,
                        "--job-timeout", 20, *extra, moto_url=moto_url, python=python)
        codes.append(batch.returncode)
        said += batch.stderr
        assert batch.returncode in (0, 1, 75), batch.stderr
        counts = json.loads(batch.stderr.rsplit("batchq: batch ", 1)[1].split(", exit")[0])
        for key in totals:
            totals[key] += counts[key]
        if batch.returncode == 0 and left(sqs, url) == 0:
            return totals, codes, said
    raise AssertionError("not drained after %d batches: %s" % (runs, codes))


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_a_drain_with_poison_jobs(sqs, moto_url, tmp_path, fifo):
    count, crashing, raising, max_attempts = (24, 2, 2, 3) if not fifo else (12, 1, 1, 3)
    url, dlq = make_queues(sqs, fifo=fifo, max_receive=max_attempts + 2)
    sent = program("batchq-sqs-enqueue", count, "--queue-url", url, "--crashing", crashing, "--raising", raising,
                   *(["--fifo-groups", 3] if fifo else []), moto_url=moto_url)
    assert sent.returncode == 0, sent.stderr
    results = tmp_path / "results"
    totals, codes, _said = drain(sqs, url, results, moto_url, max_attempts, limit=10)
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
    code = guide_consumer("An SQS queue")
    assert 12 <= len(code.splitlines()) <= 16
    library = tmp_path / "lib"
    library.mkdir()
    shutil.copy(os.path.join(TOP, "examples", "queue_library", "batchq_queue.py"), library)
    shutil.copy(os.path.join(SQS, "batchq_sqs.py"), library)
    # where examples/sqs_queue/sqs.yml installs them
    assert '"/usr/local/lib/batchq-queue"' in code
    consumer = tmp_path / "consumer"
    consumer.write_text(code.replace('"/usr/local/lib/batchq-queue"', repr(str(library))))
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


def attribute(sqs, url, name):
    return int(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[name])["Attributes"][name])


def has_child(pid):
    """True when process pid has a child (a job's process of a batch)."""
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % entry, encoding="utf-8") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # not a process, or one that ended meanwhile
        if int(fields[1]) == pid:
            return True
    return False


def said_ids(stderr, words):
    """The message ids of the lines "batchq-sqs: ID: WORDS..." of stderr."""
    ids = []
    for line in stderr.splitlines():
        parts = line.split(": ", 2)
        if len(parts) == 3 and parts[0] == "batchq-sqs" and parts[2].startswith(words):
            ids.append(parts[1])
    return ids


@pytest.mark.parametrize("python", PYTHONS)
def test_two_consumers_sharing_a_results_table_store_each_result_once(sqs, moto_url, python):
    """Consumer A receives every message and starts the first job. Then it stops (SIGSTOP: a paused or
    cut-off host) and cannot renew their visibility. SQS gives them to consumer B, which does them all.
    A goes on: the result of the job it ran is dropped, and the rest are deleted without work."""
    url, dlq = make_queues(sqs, max_receive=5)
    dynamodb, table = make_table(moto_url)
    bodies = [json.dumps({"n": n}) for n in range(6)]
    sent = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(n), "MessageBody": body}
                                                         for n, body in enumerate(bodies)])
    assert not sent.get("Failed")
    body_of = {entry["MessageId"]: bodies[int(entry["Id"])] for entry in sent["Successful"]}
    shared = ["--results-table", table, "--table-endpoint-url", moto_url]
    first = subprocess.Popen(command("batchq-sqs", ["--queue-url", url, "--limit", 6, "--work-ms", 2000,
                                                    "--max-attempts", 3,
                                                    "--visibility-timeout", 10, "--wait-seconds", 1] + shared,
                                     moto_url, python),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def running(condition):
        if first.poll() is not None:
            raise AssertionError("A ended early with %s: %s" % (first.returncode, first.stderr.read()))
        return condition()

    try:
        wait_for(lambda: running(lambda: attribute(sqs, url, "ApproximateNumberOfMessagesNotVisible") == 6),
                 "A received all 6")
        wait_for(lambda: running(lambda: has_child(first.pid)), "A started its first job")
        os.kill(first.pid, signal.SIGSTOP)  # A alone: its job's process (a group of its own) goes on
        # The visibility of 10 s ends without a renewal: SQS delivers the messages again.
        wait_for(lambda: attribute(sqs, url, "ApproximateNumberOfMessages") == 6, "the messages visible again", 40)
        second, _codes, second_said = drain(sqs, url, ("table", table), moto_url, 3, python=python)
        os.kill(first.pid, signal.SIGCONT)
        _out, first_said = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    expected = {key: {"job": key, "bytes": len(body)} for key, body in body_of.items()}
    assert table_results(dynamodb, table) == expected
    assert second["done"] == 6 and said_ids(second_said, "its result is stored already") == []
    dropped = said_ids(first_said, "another delivery's result is stored already")
    skipped = said_ids(first_said, "its result is stored already")
    # A ran one job, whose result B had stored meanwhile; it found B's results of the other five.
    assert len(dropped) == 1 and len(skipped) == 5, first_said
    assert sorted(dropped + skipped) == sorted(body_of)
    # Every done job either stored its result or was a duplicate said so: no result was stored twice.
    assert counts_of(first_said)["done"] + second["done"] == len(body_of) + len(dropped) + len(skipped)
    # A's heartbeat finds its messages gone (B deleted them): the batch says the queue failed.
    assert first.returncode == 1 and "change_message_visibility_batch" in first_said, first_said
    assert left(sqs, url) == 0 and left(sqs, dlq) == 0


@pytest.mark.parametrize("python", PYTHONS)
def test_a_drain_with_poison_jobs_and_a_results_table(sqs, moto_url, python):
    count, crashing, raising, max_attempts = 10, 1, 1, 2
    url, dlq = make_queues(sqs, max_receive=max_attempts + 2)
    dynamodb, table = make_table(moto_url)
    sent = program("batchq-sqs-enqueue", count, "--queue-url", url, "--crashing", crashing, "--raising", raising,
                   moto_url=moto_url, python=python)
    assert sent.returncode == 0, sent.stderr
    totals, codes, _said = drain(sqs, url, ("table", table), moto_url, max_attempts, python=python, limit=5)
    poison = crashing + raising
    assert (totals["done"], totals["dead"]) == (count - poison, poison)
    assert totals["failed"] == poison * (max_attempts - 1)
    stored = table_results(dynamodb, table)
    assert len(stored) == count - poison
    assert all(set(result) == {"job", "bytes"} and result["job"] == key for key, result in stored.items())
    assert left(sqs, dlq) == poison and codes[0] == 75 and codes[-1] == 0


def test_a_results_table_without_the_message_id_key_is_refused_at_start(sqs, moto_url):
    url, _dlq = make_queues(sqs)
    _dynamodb, table = make_table(moto_url, key="id")
    sqs.send_message(QueueUrl=url, MessageBody="{}")
    batch = program("batchq-sqs", "--queue-url", url, "--max-attempts", 3, "--results-table", table,
                    "--table-endpoint-url", moto_url, moto_url=moto_url)
    assert batch.returncode == 2, batch.stderr
    assert "partition key message_id" in batch.stderr
    assert attribute(sqs, url, "ApproximateNumberOfMessages") == 1  # nothing claimed
