"""batchq-sqs against the strict fake of SQS (fake_sqs.py): heartbeat,
DeleteMessageBatch's Failed entries, FIFO groups, empty queues and the
claim's slices, SIGTERM, calls cut off by the network, message attributes,
the results' retention, options, the redrive policy and credentials."""

import argparse
import base64
import importlib.machinery
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

import batchq_queue
import batchq_sqs
from conftest import SQS, parsed_options
from fake_sqs import FakeSQS


def options(**changes):
    return parsed_options(dict(backoff_min=100.0, backoff_max=100.0, job_timeout=10.0), changes)


def queue(fifo=False, max_receive=10, speed=1):
    fake = FakeSQS(speed)
    suffix = ".fifo" if fifo else ""
    fake.create_queue("dlq" + suffix)
    return fake, fake.create_queue("jobs" + suffix, dlq="dlq" + suffix, max_receive=max_receive)


def make(fake, url, tmp_path, visibility=30, max_attempts=3, **more):
    backend = batchq_sqs.SQSBackend(fake, url, str(tmp_path / "results"), visibility, 20, now=fake.now, **more)
    assert backend.setup(max_attempts) is None
    return backend


def result_files(folder):
    """The results in a results folder: what the retention keeps beside them is hidden."""
    return sorted(name for name in os.listdir(folder) if not name.startswith("."))


def run(fake, url, tmp_path, process, visibility=30, **changes):
    args = options(**changes)
    return batchq_queue.run_batch(make(fake, url, tmp_path, visibility, args.max_attempts), process, args)


def calls(fake, operation):
    return [params for name, params in fake.calls if name == operation]


def ok(job):
    return {"body": job.payload}


@pytest.fixture
def fast(monkeypatch):
    """The queue's time 5 times real time, and a heartbeat 5 times as often: a 10 s visibility passes in 2 s."""
    monkeypatch.setattr(batchq_queue, "HEARTBEAT", 0.2)
    return 5


def test_the_heartbeat_keeps_a_long_job_and_the_jobs_behind_it_hidden(tmp_path, fast):
    fake, url = queue(speed=fast)
    first, second = fake.add(url, "slow"), fake.add(url, "quick")

    def process(job):
        time.sleep(3.0 if job.payload == "slow" else 0)  # 15 s of the queue's time
        return ok(job)

    assert run(fake, url, tmp_path, process, visibility=10) == 0
    renewed = [entry["ReceiptHandle"] for params in calls(fake, "ChangeMessageVisibilityBatch")
               for entry in params["Entries"]]
    # every renewal found its message still in flight (the fake refuses it otherwise)
    assert renewed.count(first.handle) >= 2 and second.handle in renewed
    assert (first.receives, second.receives) == (1, 1)
    assert fake.bodies(url) == []
    assert result_files(tmp_path / "results") == sorted([first.id + ".json", second.id + ".json"])


def test_a_stale_handle_stops_neither_the_other_renewals_nor_the_heartbeat(tmp_path):
    fake, url = queue()
    messages = [fake.add(url, str(n)) for n in range(15)]
    backend = make(fake, url, tmp_path, visibility=30)
    jobs = backend.claim(15)
    messages[1].handle = "taken-by-another-consumer"
    fake.advance(15)
    with pytest.raises(batchq_queue.QueueError, match="1 failed"):
        backend.keep_alive(jobs)
    fake.advance(16)  # past the first visibility: only the renewed messages are still hidden
    assert [fake.in_flight(message) for message in messages] == [True, False] + [True] * 13
    backend.keep_alive(jobs)  # the stale one is not tried again: no second error
    assert [len(params["Entries"]) for params in calls(fake, "ChangeMessageVisibilityBatch")] == [10, 5, 10, 4]


def test_done_messages_stay_hidden_until_they_are_deleted(tmp_path, fast):
    fake, url = queue(speed=fast)
    for n in range(3):
        fake.add(url, str(n))
    backend = make(fake, url, tmp_path, visibility=10)
    finish = backend.finish
    again = []

    def check_then_finish():
        again.extend(fake.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []))
        finish()

    backend.finish = check_then_finish

    def slow(job):
        time.sleep(1.5)  # 7.5 s of the queue's time
        return ok(job)

    assert batchq_queue.run_batch(backend, slow, options()) == 0
    assert again == []  # another consumer would have received the done ones again
    assert fake.bodies(url) == []


def test_each_full_group_of_10_is_deleted_at_once(tmp_path):
    fake, url = queue()
    for n in range(12):
        fake.add(url, str(n))
    assert run(fake, url, tmp_path, ok, limit=12) == 75  # a full batch
    assert [len(params["Entries"]) for params in calls(fake, "DeleteMessageBatch")] == [10, 2]


def test_delete_batch_retries_only_its_failed_entries_with_the_latest_handle(tmp_path):
    fake, url = queue()
    messages = [fake.add(url, str(n)) for n in range(3)]
    backend = make(fake, url, tmp_path, visibility=10)
    jobs = backend.claim(10)
    fake.advance(11)  # their visibility lapses: a second receive gives new handles
    again = backend.claim(10)
    assert {job.id for job in again} == {job.id for job in jobs}
    fake.fail_delete_once.add(messages[1].id)
    for job in again:
        backend.done(job, '"x"')
    backend.finish()
    deletes = calls(fake, "DeleteMessageBatch")
    assert [len(params["Entries"]) for params in deletes] == [3, 1]
    assert deletes[1]["Entries"][0]["ReceiptHandle"] == messages[1].handle
    assert fake.bodies(url) == []


def test_a_delete_that_keeps_failing_is_a_queue_error(tmp_path):
    fake, url = queue()
    fake.add(url, "a")
    backend = make(fake, url, tmp_path)
    job, = backend.claim(10)
    fake.queues[url].messages[0].handle = "gone"  # as if another consumer received it since
    backend.done(job, '"x"')
    with pytest.raises(batchq_queue.QueueError):
        backend.finish()
    assert len(calls(fake, "DeleteMessageBatch")) == 3  # bounded


def test_a_failing_fifo_message_holds_its_group_alone(tmp_path):
    fake, url = queue(fifo=True)
    poison = fake.add(url, "poison", group="g1")
    behind = [fake.add(url, "x%d" % n, group="g1") for n in range(2)]
    other = [fake.add(url, "y%d" % n, group="g2") for n in range(2)]

    def process(job):
        if job.payload == "poison":
            raise ValueError("poison")
        return ok(job)

    codes = [run(fake, url, tmp_path, process, max_attempts=3) for _round in range(3)]
    assert [message.receives for message in other] == [1, 1]
    assert [message.receives for message in behind] == [0, 0]  # never received behind it: not charged
    assert fake.bodies(url) == ["poison", "x0", "x1"]
    assert codes[-1] == 0
    for _round in range(20):
        fake.advance(101)
        run(fake, url, tmp_path, process, max_attempts=3)
    assert fake.bodies(url) == []
    assert poison.receives == 3 and [message.receives for message in behind] == [1, 1]
    assert fake.bodies(fake.url("dlq.fifo")) == ["poison"]
    assert result_files(tmp_path / "results") == sorted(m.id + ".json" for m in behind + other)


def test_an_empty_queue_is_decided_by_a_long_poll_in_slices_of_a_second(tmp_path):
    fake, url = queue()
    assert run(fake, url, tmp_path, ok) == 0
    # --wait-seconds (20 here) in long polls of a second each: a SIGTERM is seen between two of them.
    assert [params["WaitTimeSeconds"] for params in calls(fake, "ReceiveMessage")] == [1] * 20


@pytest.fixture
def term():
    """TERM["asked"] as the test sets it, and False again after the test."""
    yield batchq_queue.TERM
    batchq_queue.TERM["asked"] = False


def test_a_sigterm_before_the_claim_receives_nothing(tmp_path, term):
    fake, url = queue()
    message = fake.add(url, "a")
    backend = make(fake, url, tmp_path)
    term["asked"] = True
    assert backend.claim(10) == []
    assert calls(fake, "ReceiveMessage") == [] and message.receives == 0


@pytest.mark.parametrize("slices", [1, 3])
def test_a_sigterm_during_the_long_poll_ends_the_claim_after_its_slice(tmp_path, term, slices):
    fake, url = queue()
    backend = make(fake, url, tmp_path)
    real = fake.receive_message

    def receive(**params):
        if len(calls(fake, "ReceiveMessage")) == slices - 1:
            term["asked"] = True  # the SIGTERM comes while this slice waits
        return real(**params)

    fake.receive_message = receive
    assert backend.claim(10) == []
    assert len(calls(fake, "ReceiveMessage")) == slices
    message = fake.add(url, "sent after the SIGTERM")
    assert backend.claim(10) == [] and message.receives == 0


def test_a_short_receive_that_misses_messages_is_not_empty(tmp_path):
    fake, url = queue()
    fake.short_receives_miss = True
    for n in range(15):
        fake.add(url, str(n))
    assert run(fake, url, tmp_path, ok, limit=25) == 75  # 10 done, 5 wait: a backlog
    assert run(fake, url, tmp_path, ok, limit=25) == 0
    assert fake.bodies(url) == []
    assert all(params["MaxNumberOfMessages"] <= 10 for params in calls(fake, "ReceiveMessage"))


def test_a_batch_of_25_takes_three_receives(tmp_path):
    fake, url = queue()
    for n in range(30):
        fake.add(url, str(n))
    assert run(fake, url, tmp_path, ok, limit=25) == 75
    assert [params["MaxNumberOfMessages"] for params in calls(fake, "ReceiveMessage")] == [10, 10, 5]
    # the first a long poll's first slice, which found messages; the others do not wait
    assert [params["WaitTimeSeconds"] for params in calls(fake, "ReceiveMessage")] == [1, 0, 0]
    assert len(fake.bodies(url)) == 5


def test_a_failed_message_comes_back_after_its_backoff_to_the_millisecond(tmp_path):
    fake, url = queue(speed=0)  # the queue's clock moves only by advance(): exact to the millisecond
    fake.add(url, "a")

    def fail(job):
        raise ValueError("no")

    assert run(fake, url, tmp_path, fail, backoff_min=4.0, backoff_max=4.0) == 1
    params, = calls(fake, "ChangeMessageVisibility")
    assert params["VisibilityTimeout"] in (2, 3, 4)
    fake.advance(params["VisibilityTimeout"] - 0.001)
    assert fake.receive_message(QueueUrl=url) == {}  # one millisecond early: still hidden
    fake.advance(0.001)
    assert [m["Body"] for m in fake.receive_message(QueueUrl=url)["Messages"]] == ["a"]


def test_a_second_delivery_is_deleted_without_work(tmp_path):
    fake, url = queue()
    fake.add(url, "a")
    backend = make(fake, url, tmp_path)
    job, = backend.claim(1)
    os.makedirs(backend.results, exist_ok=True)
    batchq_sqs.write_once(backend.result_path(job), '"first"')
    fake.advance(31)
    ran = []
    assert run(fake, url, tmp_path, lambda job: ran.append(1)) == 0
    assert ran == [] and fake.bodies(url) == []
    assert open(backend.result_path(job)).read() == '"first"'
    assert batchq_sqs.write_once(backend.result_path(job), '"second"') is False


@pytest.mark.parametrize("policy, problem", [
    ({}, "needs a redrive policy"),
    ({"RedrivePolicy": json.dumps({"deadLetterTargetArn": "arn:aws:sqs:r:1:dlq", "maxReceiveCount": 3})},
     "maxReceiveCount (3) must be above --max-attempts (3)"),
    ({"RedrivePolicy": "{"}, "needs a redrive policy"),
])
def test_the_redrive_policy_must_outlast_max_attempts(policy, problem):
    assert problem in batchq_sqs.redrive_problem(policy, 3)


def test_a_fitting_redrive_policy_passes():
    policy = {"RedrivePolicy": json.dumps({"deadLetterTargetArn": "arn:aws:sqs:r:1:dlq", "maxReceiveCount": "4"})}
    assert batchq_sqs.redrive_problem(policy, 3) is None


@pytest.mark.parametrize("argv, option", [
    (["--limit", "0"], "--limit"),
    (["--max-attempts", "0"], "--max-attempts"),
    (["--work-ms", "nan"], "--work-ms"),
    (["--visibility-timeout", "1"], "--visibility-timeout"),
    (["--visibility-timeout", "9"], "--visibility-timeout"),
    (["--wait-seconds", "21"], "--wait-seconds"),
    (["--backoff-max", "50000"], "--backoff-max"),
    (["--results", ""], "--results"),
    (["--results-table", "ab"], "--results-table"),
    (["--results-table", "batchq/results"], "--results-table"),
    (["--results-table", "batchq-results", "--results", "results"], "--results-table"),
    (["--results-days", "-1"], "--results-days"),
    (["--queue-url", ""], "--queue-url"),
    (["--queue-url", "batchq-jobs"], "--queue-url"),
])
def test_a_bad_option_exits_2_before_any_call(argv, option, tmp_path, credentials):
    env = dict(os.environ, STATE_DIRECTORY=str(tmp_path))
    if option == "--results":
        del env["STATE_DIRECTORY"]
    # An endpoint nobody listens on: a call would fail with 1, not 2.
    done = subprocess.run([sys.executable, os.path.join(SQS, "batchq-sqs"), "--queue-url", "http://127.0.0.1:9/q",
                           "--endpoint-url", "http://127.0.0.1:9", "--region", "eu-west-1"] + argv,
                          env=env, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 2, done.stderr
    assert option in done.stderr


def test_credentials_never_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-the-environment")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-the-environment")
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    args = argparse.Namespace(region="eu-west-1", profile="default")
    assert batchq_sqs.session(args).get_credentials() is None


def test_credentials_come_from_the_systemd_credential(credentials, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-the-environment")
    args = argparse.Namespace(region="eu-west-1", profile="default")
    assert batchq_sqs.session(args).get_credentials().access_key == "testing"


def test_a_credential_file_without_keys_exits_2(tmp_path, credentials):
    (credentials / "aws").write_text("[other]\naws_access_key_id = x\n")
    done = subprocess.run([sys.executable, os.path.join(SQS, "batchq-sqs"), "--queue-url", "http://127.0.0.1:9/q",
                           "--endpoint-url", "http://127.0.0.1:9", "--region", "eu-west-1", "--results", str(tmp_path)],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "profile default" in done.stderr


def test_sigterm_sends_the_messages_not_started_back_at_once(tmp_path):
    fake, url = queue()
    messages = [fake.add(url, str(n)) for n in range(3)]

    def stop(job):
        # The batch passes its SIGTERM on to the job: this job ignores it and ends, done.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.kill(os.getppid(), signal.SIGTERM)
        return ok(job)

    old = signal.signal(signal.SIGTERM, batchq_queue.on_sigterm)
    try:
        code = run(fake, url, tmp_path, stop)
    finally:
        signal.signal(signal.SIGTERM, old)
        batchq_queue.TERM["asked"] = False
    assert code == 75
    assert fake.bodies(url) == ["1", "2"]
    assert not any(fake.in_flight(message) for message in messages[1:])  # visible again now, not after a timeout
    released = [entry for params in calls(fake, "ChangeMessageVisibilityBatch") for entry in params["Entries"]
                if entry["VisibilityTimeout"] == 0]
    assert len(released) == 2


def test_the_fake_is_strict():
    fake, url = queue()
    fake.add(url, "a")
    first = fake.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=1)["Messages"][0]
    with pytest.raises(AssertionError):
        fake.receive_message(QueueUrl=url, MaxNumberOfMessages="10")  # botocore's model wants an integer
    with pytest.raises(AssertionError):
        fake.receive_message(QueueUrl=url, MaxNumberOfMessages=11)
    fake.advance(1.001)
    second = fake.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"][0]
    with pytest.raises(ClientError, match="ReceiptHandleIsInvalid"):
        fake.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=5)
    fake.advance(1.001)  # one millisecond past its visibility: no longer in flight
    with pytest.raises(ClientError, match="MessageNotInflight"):
        fake.change_message_visibility(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=5)


def test_the_fake_refuses_what_sqs_refuses():
    fake, url = queue()

    def send(body="a", value="v", kind="String"):
        fake.send_message(QueueUrl=url, MessageBody=body,
                          MessageAttributes={"n": {"DataType": kind, "StringValue": value}})

    send()
    for bad in [dict(value="\x1b[31m"), dict(value="\uffff"), dict(value=""), dict(value="", kind="Number"),
                dict(body="\x07"), dict(body="x" * (262144 - 7))]:
        with pytest.raises(ClientError, match="InvalidParameterValue"):
            send(**bad)
    send(body="x" * (262144 - 8))  # body, name, type and value: 256 KiB exactly


def test_a_control_character_in_the_last_error_still_reaches_the_dlq(tmp_path):
    fake, url = queue()
    fake.add(url, "colour")
    fake.add(url, "fine")

    def process(job):
        if job.payload == "colour":
            raise RuntimeError("\x1b[31mconnection refused\x1b[0m\uffff")
        return ok(job)

    assert run(fake, url, tmp_path, process, max_attempts=1) == 0
    assert fake.bodies(url) == []
    dead, = fake.queues[fake.url("dlq")].messages
    assert dead.attributes["batchq-error"]["StringValue"] == (
        "RuntimeError: \\x1b[31mconnection refused\\x1b[0m\\uffff")


@pytest.mark.parametrize("room", [0, 30, 200])
def test_a_body_near_the_size_limit_still_reaches_the_dlq(tmp_path, room):
    fake, url = queue()
    big = "x" * (262144 - room)  # SQS counts the body and attributes together
    fake.add(url, big)
    fake.add(url, "fine")

    def process(job):
        if job.payload == big:
            raise RuntimeError("\u00e9" * 3000)  # two bytes a character: a cut must not split one
        return ok(job)

    assert run(fake, url, tmp_path, process, max_attempts=1) == 0  # the fake refuses more than the limit
    dead, = fake.queues[fake.url("dlq")].messages
    assert dead.body == big
    names = sorted(dead.attributes)
    assert names == {0: [], 30: ["batchq-attempts"], 200: ["batchq-attempts", "batchq-error", "batchq-message-id"]}[room]
    if room == 200:
        assert dead.attributes["batchq-error"]["StringValue"].startswith("RuntimeError: \u00e9")


def load_enqueue():
    loader = importlib.machinery.SourceFileLoader("enqueue", os.path.join(SQS, "batchq-sqs-enqueue"))
    enqueue = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(enqueue)
    return enqueue


def test_a_second_enqueue_run_is_not_a_duplicate_of_the_first(monkeypatch, capsys):
    enqueue = load_enqueue()
    sent = []

    class Client:
        def send_message_batch(self, QueueUrl, Entries):  # noqa: N803 (boto3's names)
            sent.append([entry["MessageDeduplicationId"] for entry in Entries])
            return {}

    monkeypatch.setattr(batchq_sqs, "client", lambda args: Client())
    for _run in range(2):
        assert enqueue.main(["3", "--queue-url", "https://sqs.fake/q.fifo", "--fifo-groups", "2"]) == 0
    first, second = sent
    assert len(set(first)) == 3 and not set(first) & set(second)


def test_enqueue_spreads_poison_jobs_one_kind_a_job():
    enqueue = load_enqueue()
    for count, crashing, raising in [(10, 2, 3), (3, 3, 0), (5, 2, 3), (100, 7, 1)]:
        chosen = enqueue.faults(count, crashing, raising)
        assert sorted(chosen.values()) == ["crash"] * crashing + ["raise"] * raising
        assert all(1 <= n <= count for n in chosen)
    bodies = dict(enqueue.bodies(4, 1, 1))
    assert [json.loads(body) for body in bodies.values()] == [
        {"n": 1, "crash": True}, {"n": 2}, {"n": 3, "raise": True}, {"n": 4}]


def cut_off(fake, url, down):
    """The fake's ChangeMessageVisibilityBatch as a network that drops packets sees it: while down[0],
    each call is counted and times out, and SQS never sees it."""
    real = fake.change_message_visibility_batch

    def call(**params):
        if down[0]:
            fake.calls.append(("ChangeMessageVisibilityBatch", params))
            raise ReadTimeoutError(endpoint_url=url)
        return real(**params)

    fake.change_message_visibility_batch = call


def test_a_renewal_cut_off_by_the_network_is_tried_again_at_the_next_heartbeat(tmp_path):
    fake, url = queue(speed=0)
    messages = [fake.add(url, str(n)) for n in range(25)]
    backend = make(fake, url, tmp_path, visibility=10)
    jobs = backend.claim(25)
    down = [True]
    cut_off(fake, url, down)
    fake.advance(5)
    # Due, and the network is down: one call (the others would hang as long), and no error while time is left.
    backend.keep_alive(jobs)
    fake.advance(3)
    backend.keep_alive(jobs)
    assert len(calls(fake, "ChangeMessageVisibilityBatch")) == 2
    down[0] = False
    fake.advance(1)
    backend.keep_alive(jobs)  # 9 s after the receive: in time
    assert [len(params["Entries"]) for params in calls(fake, "ChangeMessageVisibilityBatch")] == [10, 10, 10, 10, 5]
    fake.advance(9.5)  # past the first visibility, and not past the renewed one
    assert all(fake.in_flight(message) for message in messages)


def test_a_renewal_cut_off_until_the_visibility_ends_is_a_queue_error(tmp_path):
    fake, url = queue(speed=0)
    fake.add(url, "a")
    backend = make(fake, url, tmp_path, visibility=10)
    jobs = backend.claim(1)
    cut_off(fake, url, [True])
    fake.advance(5)
    backend.keep_alive(jobs)
    fake.advance(5)  # the message may be back in the queue now: the batch has lost its hold
    with pytest.raises(batchq_queue.QueueError, match="change_message_visibility_batch"):
        backend.keep_alive(jobs)


def test_every_call_ends_within_half_the_shortest_visibility():
    """A call hung by the network must end, with its retries, while a renewal still has time: the
    heartbeat renews at half the visibility. And the job's timeout waits for the call at most that long."""
    args = argparse.Namespace(region="eu-west-1", profile="default", endpoint_url=None)
    for service in ("sqs", "dynamodb"):
        config = batchq_sqs.client(args, service).meta.config
        attempts = config.retries["total_max_attempts"]
        assert attempts * (config.connect_timeout + config.read_timeout) < batchq_sqs.LEAST_VISIBILITY / 2.0
    poll = batchq_sqs.client(args, wait=batchq_sqs.SLICE).meta.config
    assert poll.read_timeout > batchq_sqs.SLICE  # a long poll's answer comes after its wait
    assert poll.retries["total_max_attempts"] * (poll.connect_timeout + poll.read_timeout) <= (
        batchq_sqs.LEAST_VISIBILITY / 2.0)


ATTRIBUTES = {"tenant": {"DataType": "String", "StringValue": "acme"},
              "trace-id": {"DataType": "String", "StringValue": "4bf92f35-77b3"},
              "priority": {"DataType": "Number", "StringValue": "3"},
              "region.code": {"DataType": "String.iso", "StringValue": "FR"},
              "thumbnail": {"DataType": "Binary", "BinaryValue": b"\x89PNG\x00\xff"}}


def test_the_job_sees_the_message_attributes_as_text(tmp_path):
    fake, url = queue()
    fake.add(url, "a", attributes=ATTRIBUTES)
    fake.add(url, "b")
    seen = tmp_path / "seen"
    seen.mkdir()

    def process(job):
        (seen / job.payload).write_text(json.dumps(job.attributes))
        return ok(job)

    assert run(fake, url, tmp_path, process) == 0
    assert json.loads((seen / "a").read_text()) == {
        "tenant": "acme", "trace-id": "4bf92f35-77b3", "priority": "3", "region.code": "FR",
        "thumbnail": base64.b64encode(b"\x89PNG\x00\xff").decode("ascii")}
    assert json.loads((seen / "b").read_text()) == {}
    assert all(params["MessageAttributeNames"] == ["All"] for params in calls(fake, "ReceiveMessage"))


def test_the_dead_letter_copy_keeps_the_message_attributes(tmp_path):
    fake, url = queue()
    fake.add(url, "poison", attributes=ATTRIBUTES)

    def fail(job):
        raise ValueError("no")

    assert run(fake, url, tmp_path, fail, max_attempts=1) == 1
    dead, = fake.queues[fake.url("dlq")].messages
    assert {name: dead.attributes[name] for name in ATTRIBUTES} == ATTRIBUTES
    assert dead.attributes["batchq-error"]["StringValue"] == "ValueError: no"
    assert dead.attributes["batchq-attempts"]["StringValue"] == "1"


def test_a_dead_letter_copy_keeps_nine_attributes_and_adds_what_fits_of_its_own(tmp_path):
    """SQS takes 10 attributes at most: the producer's stay, and the batch's own fill the rest. A copy
    sent back from the dead-letter queue gets new batchq- attributes, not its old ones."""
    fake, url = queue()
    attributes = {"a%d" % n: {"DataType": "String", "StringValue": str(n)} for n in range(8)}
    attributes["batchq-error"] = {"DataType": "String", "StringValue": "an older error"}
    fake.add(url, "poison", attributes=attributes)

    def fail(job):
        raise ValueError("no")

    assert run(fake, url, tmp_path, fail, max_attempts=1) == 1  # the fake refuses more than 10
    dead, = fake.queues[fake.url("dlq")].messages
    assert sorted(dead.attributes) == sorted(["a%d" % n for n in range(8)] + ["batchq-message-id", "batchq-attempts"])


def test_results_days_shorter_than_the_queues_retention_are_refused_at_start(tmp_path):
    """A result must outlive its message: a message whose delete was lost comes back while SQS keeps it."""
    fake = FakeSQS()
    fake.create_queue("dlq")
    url = fake.create_queue("jobs", dlq="dlq", max_receive=10, retention=7 * 86400)
    backend = batchq_sqs.SQSBackend(fake, url, str(tmp_path / "results"), 30, 20, now=fake.now, results_days=6)
    assert "--results-days" in backend.setup(3)
    assert calls(fake, "ReceiveMessage") == []
    for days in (7, 0):  # as long as the queue keeps a message, or for ever
        backend = batchq_sqs.SQSBackend(fake, url, str(tmp_path / "results"), 30, 20, now=fake.now,
                                        results_days=days)
        assert backend.setup(3) is None


def test_results_older_than_their_days_are_pruned_a_bounded_number_a_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(batchq_sqs, "PRUNE_MOST", 3)
    day = 86400.0
    wall = [1000 * day]
    fake, url = queue()
    old = [fake.add(url, "old%d" % n) for n in range(5)]
    backend = make(fake, url, tmp_path, results_days=4, wall=lambda: wall[0])

    def run_on():
        return batchq_queue.run_batch(backend, ok, options())

    assert run_on() == 0
    wall[0] += 2 * day
    young = fake.add(url, "young")
    assert run_on() == 0
    folder = tmp_path / "results"
    assert len(result_files(folder)) == 6
    wall[0] += 3 * day + 1  # the old ones were stored 5 days ago, the young one 3
    for left in (3, 1):  # each batch prunes 3 at most
        assert run_on() == 0
        assert len(result_files(folder)) == left
    assert result_files(folder) == [young.id + ".json"]
    assert [os.path.exists(folder / (message.id + ".json")) for message in old] == [False] * 5
    wall[0] += 2 * day
    assert run_on() == 0
    assert result_files(folder) == [] and os.listdir(folder / ".by-day") == []


def test_results_days_0_keeps_results_for_ever(tmp_path):
    wall = [1000 * 86400.0]
    fake, url = queue()
    fake.add(url, "a")
    backend = make(fake, url, tmp_path, results_days=0, wall=lambda: wall[0])
    assert batchq_queue.run_batch(backend, ok, options()) == 0
    wall[0] += 3650 * 86400
    assert batchq_queue.run_batch(backend, ok, options()) == 0
    assert len(result_files(tmp_path / "results")) == 1


def test_the_prune_by_hand_that_the_module_gives_removes_old_results(tmp_path):
    """The module's docstring says how to prune a results folder by hand: its command, run as written."""
    command = re.search(r"^find DIR .*-delete$", batchq_sqs.__doc__, re.MULTILINE).group()
    fake, url = queue()
    for n in range(3):
        fake.add(url, str(n))
    assert run(fake, url, tmp_path, ok) == 0
    folder = tmp_path / "results"
    first, second, third = result_files(folder)
    old = time.time() - 15 * 86400
    os.utime(folder / first, (old, old))
    (folder / ".tmp-left-by-a-kill").write_text("")
    os.utime(folder / ".tmp-left-by-a-kill", (old, old))
    batchq_sqs.write_once(str(folder / "stored-before-the-retention.json"), "{}")
    os.utime(folder / "stored-before-the-retention.json", (old, old))
    subprocess.run(command.replace("DIR", str(folder)), shell=True, check=True)
    assert result_files(folder) == [second, third]
    assert sorted(path.name for path in (folder / ".by-day").rglob("*.json")) == [second, third]
    assert not (folder / ".tmp-left-by-a-kill").exists()
