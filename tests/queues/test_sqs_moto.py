"""batchq-sqs and batchq-sqs-enqueue, as programs, against a moto server on
127.0.0.1: a drain with poison jobs ends with every job done once or in the
dead-letter queue after exactly --max-attempts; a queue without a fitting
redrive policy, or any other setting to fix, is refused at start; two
consumers that share a DynamoDB results table (moto serves it too) store
each message's result once, though SQS delivers a message to both; a result
the store refuses fails its job alone; message attributes reach the job and
the dead-letter copy; results expire. Behind a proxy that can drop all
traffic (a network that drops packets): a SIGTERM during the long poll, a
job's timeout and the heartbeat's renewals. The same runs under Debian 11's
boto3 1.13 and botocore 1.20 (DEBIAN11_PYTHON, a venv make queues builds)."""

import base64
import hashlib
import json
import os
import re
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import boto3
import pytest

from conftest import LIBRARY, SQS, TOP, alive, free_port, guide_consumer
from waiting import wait_for

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
    """name is a program of examples/sqs_queue, or the path of another (a consumer of the test's)."""
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
    stored = [name for name in os.listdir(results) if name.endswith(".json")]
    assert len(stored) == count - poison
    bodies = [json.loads(open(results / name).read()) for name in stored]
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


def test_an_unreachable_queue_is_exit_1(tmp_path, credentials):
    """An outage, not a setting to fix: nothing listens on the endpoint."""
    nobody = "http://127.0.0.1:%d" % free_port()
    batch = program("batchq-sqs", "--queue-url", nobody + "/123456789012/jobs", "--results", tmp_path,
                    moto_url=nobody)
    assert batch.returncode == 1, batch.stderr
    assert "Traceback" not in batch.stderr


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
    result, = [name for name in os.listdir(tmp_path / "results") if name.endswith(".json")]
    assert json.loads((tmp_path / "results" / result).read_text()) == {
        "sha256": hashlib.sha256(b"hello").hexdigest()}
    assert left(sqs, url) == 0


def attribute(sqs, url, name):
    return int(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[name])["Attributes"][name])


def children(pid):
    """The pids of process pid's children (a batch's worker)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % entry, encoding="utf-8") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # not a process, or one that ended meanwhile
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def has_child(pid):
    """True when process pid has a child (a batch's worker)."""
    return bool(children(pid))


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
    A goes on: the result of the job it ran is dropped. Its heartbeat finds the other messages gone (B
    deleted them): the queue failed, so A starts no other job."""
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
        wait_for(lambda: running(lambda: attribute(sqs, url, "ApproximateNumberOfMessagesNotVisible") == 6), 30,
                 "A received all 6")
        wait_for(lambda: running(lambda: has_child(first.pid)), 30, "A started its first job")
        os.kill(first.pid, signal.SIGSTOP)  # A alone: its job's process (a group of its own) goes on
        # The visibility of 10 s ends without a renewal: SQS delivers the messages again.
        wait_for(lambda: attribute(sqs, url, "ApproximateNumberOfMessages") == 6, 40, "the messages visible again")
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
    # A ran one job, whose result B had stored meanwhile; it started none of the other five.
    assert len(dropped) == 1 and said_ids(first_said, "its result is stored already") == [], first_said
    assert counts_of(first_said)["released"] == len(body_of) - 1, first_said
    # Every done job either stored its result or was a duplicate said so: no result was stored twice.
    assert counts_of(first_said)["done"] + second["done"] == len(body_of) + len(dropped)
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


# A consumer of the test's own: its result holds the job's attributes, and pad characters when the body asks.
CONSUMER = """\
import json
import sys
sys.path[:0] = %r
import batchq_queue
import batchq_sqs


def process(job):
    payload = json.loads(job.payload)
    if payload.get("raise"):
        raise ValueError("poison")
    return {"n": payload["n"], "attributes": job.attributes, "pad": "x" * payload.get("pad", 0)}


if __name__ == "__main__":
    sys.exit(batchq_queue.main(sys.argv[1:], process, batchq_sqs.add_options, batchq_sqs.backend,
                               batchq_sqs.check))
"""


@pytest.fixture
def consumer(tmp_path):
    path = tmp_path / "consumer"
    path.write_text(CONSUMER % [LIBRARY, SQS])
    return str(path)


def dead_letters(sqs, dlq):
    """Every message of the dead-letter queue, with its attributes."""
    found = {}
    while True:
        got = sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10, MessageAttributeNames=["All"],
                                  VisibilityTimeout=600).get("Messages", [])
        if not got:
            return list(found.values())
        found.update((message["MessageId"], message) for message in got)


def send(sqs, url, *bodies, **params):
    for body in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body), **params)


@pytest.mark.parametrize("python", PYTHONS)
def test_a_result_too_large_for_the_table_fails_that_job_alone(sqs, moto_url, consumer, python):
    """DynamoDB holds 400 KB an item: the put of a larger result is refused, and its job fails alone."""
    url, dlq = make_queues(sqs)
    dynamodb, table = make_table(moto_url)
    send(sqs, url, {"n": 1}, {"n": 2, "pad": 500000}, {"n": 3})
    batch = program(consumer, "--queue-url", url, "--results-table", table, "--table-endpoint-url", moto_url,
                    "--max-attempts", 1, "--wait-seconds", 1, moto_url=moto_url, python=python)
    assert batch.returncode == 0, batch.stderr
    assert sorted(result["n"] for result in table_results(dynamodb, table).values()) == [1, 3]
    dead, = dead_letters(sqs, dlq)
    assert json.loads(dead["Body"])["n"] == 2
    assert "its result was refused" in dead["MessageAttributes"]["batchq-error"]["StringValue"]
    assert left(sqs, url) == 0


def test_a_result_too_large_for_the_folder_fails_that_job_alone(sqs, moto_url, consumer, tmp_path):
    """A file larger than the file system (here: the consumer's RLIMIT_FSIZE) allows: EFBIG."""
    url, dlq = make_queues(sqs)
    send(sqs, url, {"n": 1}, {"n": 2, "pad": 300000}, {"n": 3})

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (200000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    results = tmp_path / "results"
    batch = subprocess.run(command(consumer, ["--queue-url", url, "--results", results, "--max-attempts", 1,
                                              "--wait-seconds", 1], moto_url),
                           capture_output=True, text=True, check=False, timeout=120, preexec_fn=small_files)
    assert batch.returncode == 0, batch.stderr
    stored = [json.loads((results / name).read_text()) for name in os.listdir(results) if name.endswith(".json")]
    assert sorted(result["n"] for result in stored) == [1, 3]
    assert not [name for name in os.listdir(results) if name.startswith(".tmp-")]  # nothing half written
    dead, = dead_letters(sqs, dlq)
    assert json.loads(dead["Body"])["n"] == 2
    assert "its result was refused" in dead["MessageAttributes"]["batchq-error"]["StringValue"]


SENT_ATTRIBUTES = {"tenant": {"DataType": "String", "StringValue": "acme"},
                   "trace-id": {"DataType": "String", "StringValue": "4bf92f3577b34da6"},
                   "priority": {"DataType": "Number", "StringValue": "3"},
                   "thumbnail": {"DataType": "Binary", "BinaryValue": b"\x89PNG\x00\xff"}}


@pytest.mark.parametrize("python", PYTHONS)
def test_the_job_and_the_dead_letter_copy_get_the_message_attributes(sqs, moto_url, consumer, tmp_path, python):
    url, dlq = make_queues(sqs)
    send(sqs, url, {"n": 1}, {"n": 2, "raise": True}, MessageAttributes=SENT_ATTRIBUTES)
    results = tmp_path / "results"
    batch = program(consumer, "--queue-url", url, "--results", results, "--max-attempts", 1, "--wait-seconds", 1,
                    moto_url=moto_url, python=python)
    assert batch.returncode == 0, batch.stderr
    stored, = [json.loads((results / name).read_text()) for name in os.listdir(results) if name.endswith(".json")]
    assert stored["attributes"] == {"tenant": "acme", "trace-id": "4bf92f3577b34da6", "priority": "3",
                                    "thumbnail": base64.b64encode(b"\x89PNG\x00\xff").decode("ascii")}
    dead, = dead_letters(sqs, dlq)
    assert {name: dead["MessageAttributes"][name] for name in SENT_ATTRIBUTES} == SENT_ATTRIBUTES
    assert dead["MessageAttributes"]["batchq-attempts"]["StringValue"] == "1"


@pytest.mark.parametrize("case, fix", [
    ("no region", "--region"),
    ("no credentials", "credential aws"),
    ("no such queue", "--queue-url"),
    ("no such dead-letter queue", "dead-letter queue"),
    ("no such table", "--results-table"),
])
def test_a_setting_to_fix_is_exit_2_in_one_line_before_any_claim(sqs, moto_url, tmp_path, case, fix):
    url, dlq = make_queues(sqs, max_receive=6)  # above the default --max-attempts, 5
    sqs.send_message(QueueUrl=url, MessageBody="{}")
    argv = ["--queue-url", url, "--results", tmp_path / "results", "--wait-seconds", 1]
    env = dict(os.environ)
    if case == "no region":
        argv = [sys.executable, os.path.join(SQS, "batchq-sqs"), "--endpoint-url", moto_url] + argv
    else:
        argv = command("batchq-sqs", argv, moto_url)
    if case == "no credentials":
        del env["CREDENTIALS_DIRECTORY"]  # and none in the environment nor from an instance (conftest)
    elif case == "no such queue":
        argv[argv.index(url)] = url + "-missing"
    elif case == "no such dead-letter queue":
        sqs.delete_queue(QueueUrl=dlq)
    elif case == "no such table":
        argv[argv.index("--results"):argv.index("--results") + 2] = [
            "--results-table", "missing-" + uuid.uuid4().hex[:8], "--table-endpoint-url", moto_url]
    batch = subprocess.run([str(arg) for arg in argv], env=env, capture_output=True, text=True, check=False,
                           timeout=120)
    assert batch.returncode == 2, batch.stderr
    line, = batch.stderr.splitlines()
    assert line.startswith("batchq-sqs: error: ") and fix in line, line
    assert (attribute(sqs, url, "ApproximateNumberOfMessages"),
            attribute(sqs, url, "ApproximateNumberOfMessagesNotVisible")) == (1, 0)  # nothing claimed


@pytest.mark.parametrize("days", [14, 0])
def test_each_result_in_the_table_expires_after_the_results_days(sqs, moto_url, days):
    """DynamoDB's time to live deletes an item once the time in its expires_at has passed
    (when the table's TTL is on, on that attribute). --results-days 0 keeps results for ever."""
    url, _dlq = make_queues(sqs)
    dynamodb, table = make_table(moto_url)
    sqs.send_message(QueueUrl=url, MessageBody="{}")
    before = int(time.time())
    batch = program("batchq-sqs", "--queue-url", url, "--results-table", table, "--table-endpoint-url", moto_url,
                    "--results-days", days, "--max-attempts", 3, "--wait-seconds", 1, moto_url=moto_url)
    after = int(time.time()) + 1
    assert batch.returncode == 0, batch.stderr
    item, = dynamodb.scan(TableName=table, ConsistentRead=True)["Items"]
    if days:
        assert before + days * 86400 <= int(item["expires_at"]["N"]) <= after + days * 86400
    else:
        assert "expires_at" not in item


# The action of a request to SQS or DynamoDB: in a header (JSON protocol) or the body (query protocol).
ACTION = re.compile(rb"(?:AmazonSQS|DynamoDB_\d+)\.(\w+)|Action=(\w+)")


class BlackHole:
    """A TCP proxy on 127.0.0.1 in front of moto that can stop forwarding: a network that drops packets.
    While the hole is open, whatever either side sends is read and dropped, on the connections made
    before and after. It notes each request's action, forwarded or dropped."""

    def __init__(self, port):
        self.upstream = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        self.dropping = False
        self.seen = []  # (action, "forwarded" or "dropped")
        self.peers = {}  # a socket: the other end of its connection
        self.clients = set()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.stopping = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def hole(self, dropping):
        self.dropping = dropping

    def count(self, action, how=None):
        return sum(1 for seen, fate in list(self.seen) if seen == action and how in (None, fate))

    def serve(self):
        while not self.stopping:
            for key, _events in self.selector.select(0.1):
                if key.fileobj is self.listener:
                    self.accept()
                elif key.fileobj in self.peers:
                    self.pump(key.fileobj)
        for sock in [self.listener] + list(self.peers):
            sock.close()

    def accept(self):
        client, _address = self.listener.accept()
        upstream = socket.create_connection(self.upstream)
        for sock in (client, upstream):
            sock.setblocking(True)
            self.selector.register(sock, selectors.EVENT_READ)
        self.peers[client], self.peers[upstream] = upstream, client
        self.clients.add(client)

    def pump(self, sock):
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            for end in (sock, self.peers[sock]):
                self.selector.unregister(end)
                self.clients.discard(end)
                end.close()
            other = self.peers.pop(sock)
            self.peers.pop(other)
            return
        dropping = self.dropping
        if sock in self.clients:
            for match in ACTION.finditer(data):
                self.seen.append(((match.group(1) or match.group(2)).decode(), "dropped" if dropping else "forwarded"))
        if not dropping:
            self.peers[sock].sendall(data)

    def close(self):
        self.stopping = True
        self.thread.join(10)


@pytest.fixture
def proxy(moto_url):
    hole = BlackHole(int(moto_url.rsplit(":", 1)[1]))
    yield hole
    hole.close()


def started(argv):
    return subprocess.Popen([str(arg) for arg in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def while_running(process, condition):
    """condition, as a check that fails at once when process has ended."""
    def check():
        if process.poll() is not None:
            raise AssertionError("ended early with %s: %s" % (process.returncode, process.stderr.read()))
        return condition()
    return check


def ended(process, timeout=120):
    """The stderr of process, once it has ended; killed if it outlasts timeout."""
    try:
        return process.communicate(timeout=timeout)[1]
    finally:
        stop(process)


def stop(process):
    """Kill process unless it has ended."""
    if process.poll() is None:
        process.kill()
        process.wait()


def test_sigterm_during_the_long_poll_ends_the_batch_at_once(sqs, proxy, tmp_path):
    url, _dlq = make_queues(sqs)
    batch = started(command("batchq-sqs", ["--queue-url", url, "--results", tmp_path / "results",
                                           "--max-attempts", 3, "--wait-seconds", 20], proxy.url))
    try:
        wait_for(while_running(batch, lambda: proxy.count("ReceiveMessage")), 60, "the batch's first receive")
        os.kill(batch.pid, signal.SIGTERM)
        stopped = time.monotonic()
        asked = proxy.count("ReceiveMessage")
        stderr = ended(batch)
        took = time.monotonic() - stopped
    finally:
        stop(batch)
    print("the batch ended %.2f s after its SIGTERM" % took)
    assert batch.returncode == 0, stderr
    assert took < 3.0, "the batch ended %.1f s after its SIGTERM: %s" % (took, stderr)
    # At most one receive after the SIGTERM: one that began as the signal came.
    assert proxy.count("ReceiveMessage") <= asked + 1


def test_a_black_holed_network_holds_no_job_past_its_timeout(sqs, proxy, tmp_path):
    """A renewal or any other call that the network drops ends at its read timeout: the job's
    timeout is kept, though the batch checks it between calls."""
    url, _dlq = make_queues(sqs)
    sqs.send_message(QueueUrl=url, MessageBody="{}")
    batch = started(command("batchq-sqs", ["--queue-url", url, "--results", tmp_path / "results",
                                           "--visibility-timeout", 10, "--job-timeout", 8, "--work-ms", 60000,
                                           "--max-attempts", 3, "--wait-seconds", 1], proxy.url))
    try:
        worker, = wait_for(while_running(batch, lambda: children(batch.pid)), 60, "the job to start")
        begun = time.monotonic()
        proxy.hole(True)  # for as long as the job may run, and more
        wait_for(lambda: not alive(worker), 60, "the job to end")
        ran = time.monotonic() - begun
        proxy.hole(False)
        stderr = ended(batch)
    finally:
        stop(batch)
    print("the job ran %.2f s, with --job-timeout 8" % ran)
    assert ran < 8 + 6, "the job ran %.1f s, with --job-timeout 8: %s" % (ran, stderr)
    assert batch.returncode == 1 and "Traceback" not in stderr, stderr  # its failure could not be recorded


def test_a_renewal_the_network_dropped_is_tried_again_in_time(sqs, moto_url, proxy, tmp_path):
    """The network drops a renewal, then comes back: the renewal is tried again before the message's
    visibility ends, so SQS never shows it to another consumer."""
    url, _dlq = make_queues(sqs)
    sqs.send_message(QueueUrl=url, MessageBody="{}")
    batch = started(command("batchq-sqs", ["--queue-url", url, "--results", tmp_path / "results",
                                           "--visibility-timeout", 10, "--work-ms", 20000, "--job-timeout", 60,
                                           "--max-attempts", 3, "--wait-seconds", 1], proxy.url))
    shown = dropped_at = None
    try:
        wait_for(while_running(batch, lambda: children(batch.pid)), 60, "the job to start")  # received
        deadline = time.monotonic() + 120
        while batch.poll() is None and time.monotonic() < deadline:
            if shown is None and attribute(sqs, url, "ApproximateNumberOfMessages"):
                shown = time.monotonic()
            if not proxy.dropping and dropped_at is None and proxy.count("ChangeMessageVisibilityBatch"):
                proxy.hole(True)  # from just after the first renewal: the next one falls in it
            elif proxy.dropping and dropped_at is None and proxy.count("ChangeMessageVisibilityBatch", "dropped"):
                dropped_at = time.monotonic()
            elif proxy.dropping and dropped_at is not None and time.monotonic() > dropped_at + 1.0:
                proxy.hole(False)  # the network is back a second after it dropped the renewal
            time.sleep(0.1)
        stderr = ended(batch)
    finally:
        stop(batch)
    assert dropped_at is not None, "no renewal fell in the hole: " + stderr
    print("renewals forwarded %d, dropped %d" % (proxy.count("ChangeMessageVisibilityBatch", "forwarded"),
                                                 proxy.count("ChangeMessageVisibilityBatch", "dropped")))
    assert shown is None, "the message showed %.1f s after the renewal was dropped: %s" % (shown - dropped_at, stderr)
    assert batch.returncode == 0, stderr
    assert len([name for name in os.listdir(tmp_path / "results") if name.endswith(".json")]) == 1
    assert left(sqs, url) == 0
