# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An Amazon SQS queue as a batchq_queue Backend. Needs boto3 (Debian: python3-boto3).

The queue must have a redrive policy with a dead-letter queue (DLQ) and a
maxReceiveCount above --max-attempts; the batch exits 2 at start otherwise.
The consumer itself moves a job to the DLQ after --max-attempts failed
attempts: the body, and the message attributes batchq-message-id,
batchq-attempts and batchq-error. SQS allows 256 KiB for all of them: the
error is cut to fit, and an attribute that does not fit is left out.
The redrive policy is the backstop: it moves a message whose batches all
died (the host lost, the consumer killed) before any could tell.

Attempts: a message's ApproximateReceiveCount. SQS counts it at receive,
before any work.

Claim: receives of at most 10 messages each, until --limit. The first
receive waits up to --wait-seconds (20 at most, a long poll). Only when that
one returns nothing is the queue empty: a short receive may miss messages.
The receives after it do not wait. A FIFO queue is read one message per
receive. So a batch never holds a message behind another of its group: SQS
keeps a group locked while one of its messages is in flight. A failed
message stays in flight for its backoff and so holds its own group alone.

Heartbeat: while the batch holds messages, each is made invisible again for
--visibility-timeout once half of it has passed (ChangeMessageVisibilityBatch).
The batch checks about every second while a job runs, and between jobs.
--visibility-timeout is 10 seconds at least: a slow call has room before a
message would show again.

Results once: SQS delivers at least once. Each result is stored once, keyed
by the message id; a message whose result is stored already is deleted
without work. Two deliveries may still both run (another batch took the
message while this one's work ran): the second result is dropped, and the
batch says so on stderr. Two stores:
- --results-table NAME: a DynamoDB table that every host shares. Its
  partition key is message_id, a string. A result is an item written by
  PutItem with the condition attribute_not_exists(message_id), so the first
  delivery's stays. It is read back with a consistent read. An item holds at
  most 400 KB: a larger result fails the put, and the batch exits 1.
- --results DIR (by default results/ in $STATE_DIRECTORY), for one host
  alone: MESSAGE_ID.json, made by link() of a synced temporary file. link()
  never replaces a file. The folder is local: a message delivered again to
  another host gets its result applied there a second time.

Done and dead messages are deleted by DeleteMessageBatch, 10 at a time as
they end, and the rest at the end of the batch. Until then the heartbeat
keeps them hidden too. Its Failed entries alone are retried, each with the
message's latest receipt handle, up to three times.

A failed job's message is made visible again after its backoff (its
visibility timeout set to the backoff, at most 12 hours less its time in
flight).

boto3: Debian's python3-boto3 (1.13.14 with botocore 1.20.0 on Debian 11,
1.26.27 with 1.29.27 on 12, 1.37.9 on 13). Only calls and parameters that
boto3 1.13 and botocore 1.16 have are used: ReceiveMessage's AttributeNames
(not the newer MessageSystemAttributeNames), Config's retry mode "standard"
(botocore 1.15), DynamoDB's ConditionExpression and ConsistentRead.

Credentials: the AWS shared-credentials file $CREDENTIALS_DIRECTORY/aws
(the role's credential "aws"), or else botocore's chain without the
environment (an instance role, say). AWS_ACCESS_KEY_ID and its kin are never
read.
"""

import configparser
import errno
import json
import math
import os
import sys
import tempfile
import time

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

import batchq_queue

# SQS's own limits.
MOST_MESSAGES = 10
# The shortest --visibility-timeout. A renewal is due at half of it, and a heartbeat comes about
# every second: 5 seconds leave room for a slow call before a message would show again.
LEAST_VISIBILITY = 10
MOST_WAIT = 20
MOST_VISIBILITY = 43200
# A message's body and attributes (names, types and values) together, in bytes.
MOST_BYTES = 262144
# The results table's partition key: the message id, a string.
TABLE_KEY = "message_id"


def add_options(parser):
    parser.add_argument("--queue-url", required=True, help="the queue's URL")
    parser.add_argument("--endpoint-url", help="another SQS endpoint (tests, a VPC endpoint)")
    parser.add_argument("--region", help="the queue's region")
    parser.add_argument("--visibility-timeout", type=int, default=60,
                        help="seconds a received message stays hidden; renewed while its job runs")
    parser.add_argument("--wait-seconds", type=int, default=MOST_WAIT, help="the long poll of the first receive")
    parser.add_argument("--results", help="the results folder of this host (default: results/ in $STATE_DIRECTORY)")
    parser.add_argument("--results-table", help="a DynamoDB table of results that every host shares, instead")
    parser.add_argument("--table-endpoint-url", help="another DynamoDB endpoint (tests, a VPC endpoint)")
    parser.add_argument("--profile", default="default", help="the section of the credentials file")


def check(args):
    """What is wrong with the SQS options; None when nothing is."""
    if not LEAST_VISIBILITY <= args.visibility_timeout <= MOST_VISIBILITY:
        return "--visibility-timeout: must be from %d to %d seconds, got %s" % (
            LEAST_VISIBILITY, MOST_VISIBILITY, args.visibility_timeout)
    if not 1 <= args.wait_seconds <= MOST_WAIT:
        return "--wait-seconds: must be from 1 to %d, got %s" % (MOST_WAIT, args.wait_seconds)
    if args.backoff_max > MOST_VISIBILITY:
        return "--backoff-max: must be at most %d seconds (SQS's longest visibility), got %s" % (
            MOST_VISIBILITY, args.backoff_max)
    if args.results_table is not None:
        # DynamoDB's own rule for a table name.
        if not (3 <= len(args.results_table) <= 255 and
                all(c.isascii() and (c.isalnum() or c in "_.-") for c in args.results_table)):
            return "--results-table: must be 3 to 255 letters, digits, _, . and -, got %r" % args.results_table
        if args.results:
            return "--results-table: one store of results, not both --results and --results-table"
    elif not args.results and not os.environ.get("STATE_DIRECTORY"):
        return "--results: needed when $STATE_DIRECTORY is not set"
    return None


def aws_credentials(directory, profile):
    """The keys of the shared-credentials file aws in directory, or None when there is none."""
    if not directory:
        return None
    path = os.path.join(directory.split(":")[0], "aws")
    if not os.path.exists(path):
        return None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
        section = parser[profile]
        keys = {"aws_access_key_id": section["aws_access_key_id"],
                "aws_secret_access_key": section["aws_secret_access_key"]}
    except (configparser.Error, KeyError) as exc:
        raise ValueError("the credential aws has no keys for profile %s: %s" % (profile, type(exc).__name__))
    if section.get("aws_session_token"):
        keys["aws_session_token"] = section["aws_session_token"]
    return keys


def session(args, environ=None):
    """A boto3 session whose credentials never come from the environment."""
    environ = os.environ if environ is None else environ
    core = botocore.session.Session()
    core.get_component("credential_provider").remove("env")
    keys = aws_credentials(environ.get("CREDENTIALS_DIRECTORY"), args.profile)
    if keys:
        return boto3.Session(region_name=args.region, botocore_session=core, **keys)
    return boto3.Session(region_name=args.region, botocore_session=core)


def client(args, service="sqs", endpoint_url=None):
    # retries' "mode" came with botocore 1.15: Debian 11's 1.20 has it.
    config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10,
                    read_timeout=MOST_WAIT + 10)
    if service == "sqs":
        endpoint_url = args.endpoint_url
    return session(args).client(service, endpoint_url=endpoint_url, config=config)


def backend(args):
    """The backend of the options; exits 2 when the queue lacks a fitting redrive policy."""
    results = table = None
    if not args.results_table:
        results = args.results or os.path.join(os.environ["STATE_DIRECTORY"].split(":")[0], "results")
    try:
        sqs_client = client(args)
        if args.results_table:
            table = ResultsTable(client(args, "dynamodb", args.table_endpoint_url), args.results_table)
    except ValueError as exc:  # a credential file without the keys: a setting to fix, not an outage
        print("batchq-sqs: error: %s" % exc, file=sys.stderr)
        sys.exit(2)
    sqs = SQSBackend(sqs_client, args.queue_url, results, args.visibility_timeout, args.wait_seconds, table=table)
    try:
        problem = sqs.setup(args.max_attempts)
    except batchq_queue.QueueError as exc:
        raise SystemExit("batchq-sqs: the queue failed at start: %s" % exc)
    if problem:
        print("batchq-sqs: error: %s" % problem, file=sys.stderr)
        sys.exit(2)
    return sqs


def redrive_problem(attributes, max_attempts):
    """What is wrong with a queue's redrive policy for --max-attempts; None when nothing is."""
    try:
        policy = json.loads(attributes["RedrivePolicy"])
        arn, most = policy["deadLetterTargetArn"], int(policy["maxReceiveCount"])
    except (KeyError, ValueError, TypeError):
        return "the queue needs a redrive policy with a dead-letter queue"
    if most <= max_attempts:
        return "the redrive policy's maxReceiveCount (%d) must be above --max-attempts (%d)" % (most, max_attempts)
    return None if arn.count(":") >= 5 else "the redrive policy's deadLetterTargetArn is not an ARN: %s" % arn


class ResultsTable:
    """Results in a DynamoDB table that every host shares, one item per message id, written once."""

    def __init__(self, dynamodb, name):
        self.dynamodb = dynamodb
        self.name = name

    def call(self, name, **params):
        try:
            return getattr(self.dynamodb, name)(**params)
        except (BotoCoreError, ClientError) as exc:
            raise batchq_queue.QueueError("%s %s: %s" % (name, self.name, exc))

    def problem(self):
        """What is wrong with the table's key; None when nothing is."""
        table = self.call("describe_table", TableName=self.name)["Table"]
        types = {item["AttributeName"]: item["AttributeType"] for item in table.get("AttributeDefinitions", [])}
        if table.get("KeySchema") != [{"AttributeName": TABLE_KEY, "KeyType": "HASH"}] or types.get(TABLE_KEY) != "S":
            return "the results table %s must have the partition key %s, a string, and no sort key" % (
                self.name, TABLE_KEY)
        return None

    def has(self, key):
        # A consistent read: a put that another host made a moment ago is seen.
        reply = self.call("get_item", TableName=self.name, Key={TABLE_KEY: {"S": key}}, ConsistentRead=True,
                          ProjectionExpression=TABLE_KEY)
        return "Item" in reply

    def put(self, key, text, queue_url):
        """Store the result unless one is there already; False when one was."""
        item = {TABLE_KEY: {"S": key}, "result": {"S": text}, "queue_url": {"S": queue_url},
                "stored_at": {"N": str(int(time.time()))}}
        try:
            self.dynamodb.put_item(TableName=self.name, Item=item,
                                   ConditionExpression="attribute_not_exists(%s)" % TABLE_KEY)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False  # a second delivery: the first result stays
            raise batchq_queue.QueueError("put_item %s: %s" % (self.name, exc))
        except BotoCoreError as exc:
            raise batchq_queue.QueueError("put_item %s: %s" % (self.name, exc))
        return True


class SQSBackend(batchq_queue.Backend):
    """results is the folder of results, or None with table, a ResultsTable."""

    def __init__(self, sqs, queue_url, results, visibility, wait, now=time.monotonic, table=None):
        self.sqs = sqs
        self.url = queue_url
        self.results = results
        self.table = table
        self.visibility = visibility
        self.wait = wait
        self.now = now
        self.fifo = False
        self.dlq_url = None
        self.handles = {}      # message id: its latest receipt handle
        self.hidden_at = {}    # message id: when its visibility was last set
        self.received_at = {}  # message id: its first receive in this batch
        self.deletes = []      # message ids to delete: a full group of 10 at once, the rest at finish
        self.lost = set()      # message ids whose visibility SQS refused to change: not renewed again

    def call(self, name, **params):
        try:
            return getattr(self.sqs, name)(**params)
        except (BotoCoreError, ClientError) as exc:
            raise batchq_queue.QueueError("%s: %s" % (name, exc))

    def setup(self, max_attempts):
        attributes = self.call("get_queue_attributes", QueueUrl=self.url, AttributeNames=["All"])["Attributes"]
        problem = redrive_problem(attributes, max_attempts)
        if problem:
            return problem
        self.fifo = attributes.get("FifoQueue") == "true"
        arn = json.loads(attributes["RedrivePolicy"])["deadLetterTargetArn"].split(":")
        self.dlq_url = self.call("get_queue_url", QueueName=arn[5], QueueOwnerAWSAccountId=arn[4])["QueueUrl"]
        if self.table:
            return self.table.problem()
        os.makedirs(self.results, exist_ok=True)
        return None

    def claim(self, limit):
        jobs = {}
        wait = self.wait
        while len(jobs) < limit:
            most = 1 if self.fifo else min(MOST_MESSAGES, limit - len(jobs))
            reply = self.call("receive_message", QueueUrl=self.url, MaxNumberOfMessages=most,
                              WaitTimeSeconds=wait, VisibilityTimeout=self.visibility,
                              AttributeNames=["ApproximateReceiveCount", "MessageGroupId"])
            messages = reply.get("Messages", [])
            if not messages:
                break  # after the long poll: empty; after a short one: no more for now
            wait = 0
            now = self.now()
            for message in messages:
                key = message["MessageId"]
                self.handles[key] = message["ReceiptHandle"]  # a second receive of it: only this handle works
                self.hidden_at[key] = now
                self.received_at.setdefault(key, now)
                attributes = message.get("Attributes", {})
                jobs[key] = batchq_queue.Job(key, message.get("Body", ""),
                                             int(attributes.get("ApproximateReceiveCount", "1")),
                                             group=attributes.get("MessageGroupId"))
        return list(jobs.values())

    def keep_alive(self, jobs):
        now = self.now()
        # A done or dead message waits for its delete: until then it must stay hidden too.
        keys = [job.id for job in jobs] + self.deletes
        due = [key for key in keys if key not in self.lost and now - self.hidden_at[key] >= self.visibility / 2.0]
        self.set_visibility(due, self.visibility)

    def set_visibility(self, keys, seconds):
        """Set the visibility of every message in keys, 10 a call, then raise once for what failed.
        A message SQS refused is not renewed again: its handle is stale, or it is back in the queue."""
        problems = []
        for start in range(0, len(keys), MOST_MESSAGES):
            part = keys[start:start + MOST_MESSAGES]
            entries = [{"Id": str(number), "ReceiptHandle": self.handles[key], "VisibilityTimeout": seconds}
                       for number, key in enumerate(part)]
            now = self.now()
            try:
                reply = self.call("change_message_visibility_batch", QueueUrl=self.url, Entries=entries)
            except batchq_queue.QueueError as exc:
                problems.append(str(exc))  # the other groups are still set
                continue
            for entry in reply.get("Successful", []):
                self.hidden_at[part[int(entry["Id"])]] = now
            for entry in reply.get("Failed", []):
                key = part[int(entry["Id"])]
                self.lost.add(key)
                problems.append("%s: %s" % (key, entry.get("Code")))
        if problems:
            # The first few say what went wrong; the error stays short however many failed.
            raise batchq_queue.QueueError("change_message_visibility_batch: %d failed: %s" % (
                len(problems), "; ".join(problems[:3])))

    def result_path(self, job):
        # Message ids are UUIDs; anything else is kept out of the path.
        return os.path.join(self.results, "".join(c for c in job.id if c.isalnum() or c == "-") + ".json")

    def has_result(self, job):
        found = self.table.has(job.id) if self.table else os.path.exists(self.result_path(job))
        if found:
            print("batchq-sqs: %s: its result is stored already: deleted without work" % job.id, file=sys.stderr)
        return found

    def done(self, job, result):
        if result is not None:
            if self.table:
                stored = self.table.put(job.id, result, self.url)
            else:
                try:
                    stored = write_once(self.result_path(job), result)
                except OSError as exc:  # a full disk, say: the job stays on the queue
                    raise batchq_queue.QueueError("the result of %s: %s" % (job.id, exc))
            if not stored:
                print("batchq-sqs: %s: another delivery's result is stored already: this one is dropped" % job.id,
                      file=sys.stderr)
        self.delete_later(job.id)

    def failed(self, job, error, delay):
        in_flight = self.now() - self.received_at[job.id]
        seconds = max(0, min(int(math.ceil(delay)), MOST_VISIBILITY - int(math.ceil(in_flight)) - 1))
        self.call("change_message_visibility", QueueUrl=self.url, ReceiptHandle=self.handles[job.id],
                  VisibilityTimeout=seconds)
        self.hidden_at[job.id] = self.now()

    def dead(self, job, error):
        body = job.payload or "(empty)"
        params = {"QueueUrl": self.dlq_url, "MessageBody": body,
                  "MessageAttributes": dead_attributes(len(body.encode("utf-8")), job, error)}
        if self.fifo:
            params["MessageGroupId"] = job.group or "batchq"
            params["MessageDeduplicationId"] = job.id[:128]  # a second move within 5 minutes is dropped
        # A crash between the send and the delete leaves a copy in each queue; never none.
        self.call("send_message", **params)
        self.delete_later(job.id)

    def release(self, jobs):
        self.set_visibility([job.id for job in jobs], 0)

    def delete_later(self, key):
        """Buffer a delete; a full group of 10 is deleted at once, so few messages wait."""
        self.deletes.append(key)
        if len(self.deletes) >= MOST_MESSAGES:
            self.finish()

    def finish(self):
        pending, self.deletes = self.deletes, []
        for _round in range(3):
            failed = []
            for start in range(0, len(pending), MOST_MESSAGES):
                part = pending[start:start + MOST_MESSAGES]
                entries = [{"Id": str(number), "ReceiptHandle": self.handles[key]} for number, key in enumerate(part)]
                reply = self.call("delete_message_batch", QueueUrl=self.url, Entries=entries)
                failed += [part[int(entry["Id"])] for entry in reply.get("Failed", [])]
            if not failed:
                return
            pending = failed  # only those, with the latest handle each
        raise batchq_queue.QueueError("delete_message_batch: %d messages not deleted: %s" % (len(pending), pending))

    def more(self):
        attributes = self.call("get_queue_attributes", QueueUrl=self.url,
                               AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
        return int(attributes.get("ApproximateNumberOfMessages", "0")) > 0


def dead_attributes(body_bytes, job, error):
    """The attributes of a job's copy in the DLQ that fit beside a body of body_bytes.
    SQS counts the body and attributes together: the error is cut to fit, and an attribute that
    does not fit is left out. The body is never cut: it is the job."""
    wanted = [("batchq-message-id", "String", job.id), ("batchq-attempts", "Number", str(job.attempts)),
              ("batchq-error", "String", batchq_queue.clean_text(error) or "-")]
    room = MOST_BYTES - body_bytes
    attributes = {}
    for name, kind, value in wanted:
        left = room - len(name) - len(kind)
        if name == "batchq-error":
            # "ignore" drops a character cut in two: the value stays valid UTF-8.
            value = value.encode("utf-8")[:max(left, 0)].decode("utf-8", "ignore")
        size = len(value.encode("utf-8"))
        if value and size <= left:
            attributes[name] = {"DataType": kind, "StringValue": value}
            room = left - size
    return attributes


def write_once(path, text):
    """Write text to path unless path exists: a synced temporary file, then link() (never replaces)."""
    folder = os.path.dirname(path)
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
            return False  # a second delivery: the first result stays
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return True
    finally:
        os.unlink(temporary)
