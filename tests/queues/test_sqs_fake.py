"""batchq-sqs against the strict fake of SQS (fake_sqs.py): heartbeat,
DeleteMessageBatch's Failed entries, FIFO groups, empty queues, options,
the redrive policy and credentials."""

import argparse
import importlib.machinery
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from botocore.exceptions import ClientError

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


def make(fake, url, tmp_path, visibility=30, max_attempts=3):
    backend = batchq_sqs.SQSBackend(fake, url, str(tmp_path / "results"), visibility, 20, now=fake.now)
    assert backend.setup(max_attempts) is None
    return backend


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
    assert sorted(os.listdir(tmp_path / "results")) == sorted([first.id + ".json", second.id + ".json"])


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
    assert sorted(os.listdir(tmp_path / "results")) == sorted(m.id + ".json" for m in behind + other)


def test_an_empty_queue_is_decided_by_a_long_poll(tmp_path):
    fake, url = queue()
    assert run(fake, url, tmp_path, ok) == 0
    receives = calls(fake, "ReceiveMessage")
    assert len(receives) == 1 and 1 <= receives[0]["WaitTimeSeconds"] <= 20


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
    assert [params["WaitTimeSeconds"] for params in calls(fake, "ReceiveMessage")] == [20, 0, 0]
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
])
def test_a_bad_option_exits_2_before_any_call(argv, option, tmp_path):
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
        # The signal is pending before the report is written: the batch's handler runs first.
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
