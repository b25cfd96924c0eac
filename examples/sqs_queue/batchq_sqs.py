# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An Amazon SQS queue as a batchq_queue Backend. Needs boto3 (Debian: python3-boto3).

Settings to fix exit 2 at start, in one line that names the fix, before
anything is claimed: no region, no credentials, keys or permissions AWS
refused, no such queue, a --queue-url that is not a URL, a queue without a
fitting redrive policy, no such dead-letter queue or results table. An
outage (SQS out of reach) exits 1.

The queue must have a redrive policy with a dead-letter queue (DLQ) and a
maxReceiveCount above --max-attempts. The consumer itself moves a job to the
DLQ after --max-attempts failed attempts: the body, the message's own
attributes, and the attributes batchq-message-id, batchq-attempts and
batchq-error. SQS allows 10 attributes and 256 KiB for the body and all of
them: the batch's own three go in that order while they fit, the error cut
to fit. The redrive policy is the backstop: it moves a message whose batches
all died (the host lost, the consumer killed) before any could tell.

Attributes: the job sees the message's attributes in job.attributes, name
to text: a String's or Number's value, a Binary's bytes in base64.

Attempts: a message's ApproximateReceiveCount. SQS counts it at receive,
before any work.

Claim: receives of at most 10 messages each, until --limit. The first
receive is a long poll of --wait-seconds (20 at most), made as receives that
wait a second each: a SIGTERM ends it after the second at hand, and no
receive is made after a SIGTERM. (An empty queue costs a receive a second.)
Only when the whole long poll found nothing is the queue empty: a short
receive may miss messages. The receives after the first that found messages
do not wait. A FIFO queue is read one message per receive. So a batch never
holds a message behind another of its group: SQS keeps a group locked while
one of its messages is in flight. A failed message stays in flight for its
backoff and so holds its own group alone.

Calls: each ends within 4 s (connect 2 s, read 2 s; a receive's read waits
its second more), and is made once. A network that drops packets cannot hold
the batch past a job's --job-timeout by more than a heartbeat and a call,
nor keep a renewal from a second try before a message's visibility ends.

Heartbeat: while the batch holds messages, each is made invisible again for
--visibility-timeout once half of it has passed (ChangeMessageVisibilityBatch),
the longest hidden first. The batch checks about every second while a job
runs, and between jobs. A renewal that failed (the network, SQS busy) is
tried again at the next heartbeat; the calls after it wait for that one.
Only when a message may be visible again (its visibility has passed) is that
the batch's failure. --visibility-timeout is 10 seconds at least.

Results once: SQS delivers at least once. Each result is stored once, keyed
by the message id; a message whose result is stored already is deleted
without work. Two deliveries may still both run (another batch took the
message while this one's work ran): the second result is dropped, and the
batch says so on stderr. A result the store refuses for itself alone (more
than DynamoDB's 400 KB an item, a file larger than the file system allows)
fails its job alone (batchq_queue.Refused): it goes on to its backoff, or
the DLQ. Two stores:
- --results-table NAME: a DynamoDB table that every host shares. Its
  partition key is message_id, a string. A result is an item written by
  PutItem with the condition attribute_not_exists(message_id), so the first
  delivery's stays. It is read back with a consistent read.
- --results DIR (by default results/ in $STATE_DIRECTORY), for one host
  alone: MESSAGE_ID.json, made by link() of a synced temporary file. link()
  never replaces a file. The folder is local: a message delivered again to
  another host gets its result applied there a second time.

Retention: a result is kept --results-days (14 by default; 0: for ever),
which must be at least the queue's MessageRetentionPeriod: a message whose
delete was lost comes back while SQS keeps it, and finds its result. Each
item of the table holds expires_at, the time (Unix seconds) it may go:
turn on the table's time to live on that attribute, and DynamoDB deletes
the item after it. In a folder, each result has a second link in
.by-day/YYYY-MM-DD/ (the day it was stored, UTC). Each batch, before its
claim, removes the results of the days that ended more than --results-days
ago, 1000 at most, and each day's folder once empty. By hand, files older
than 14 days (results stored before this retention too, which have no link,
and the temporary file of a batch killed as it wrote):
find DIR -type f -mtime +14 -delete

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

import base64
import configparser
import contextlib
import errno
import itertools
import json
import math
import os
import sys
import tempfile
import time
from urllib.parse import urlsplit

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

import batchq_queue

# SQS's own limits.
MOST_MESSAGES = 10
# The shortest --visibility-timeout. A renewal is due at half of it, and a heartbeat comes about
# every second: 5 seconds leave room for a call that the network drops, and a second try.
LEAST_VISIBILITY = 10
MOST_WAIT = 20
MOST_VISIBILITY = 43200
# A message's body and attributes (names, types and values) together, in bytes.
MOST_BYTES = 262144
MOST_ATTRIBUTES = 10
# The attributes the batch gives a job's copy in the dead-letter queue.
OWN_ATTRIBUTES = ("batchq-message-id", "batchq-attempts", "batchq-error")
# Every call ends within CONNECT_SECONDS + READ_SECONDS (4 s), less than half of
# LEAST_VISIBILITY: a renewal that the network drops leaves time for a second
# try before SQS would show the message again. The job's timeout is checked
# between two calls: it is kept within a heartbeat and one call. A long poll's
# answer comes after its wait, so its read timeout adds the wait.
CONNECT_SECONDS = 2
READ_SECONDS = 2
# The claim's long poll waits --wait-seconds in slices of this many seconds:
# a SIGTERM ends it after the slice at hand.
SLICE = 1
# The results table's partition key: the message id, a string.
TABLE_KEY = "message_id"
# The attribute of a result's item that DynamoDB's time to live reads: when the item may go.
EXPIRES = "expires_at"
# Results are kept this many days by default: SQS keeps a message 14 days at most.
RESULTS_DAYS = 14
MOST_DAYS = 36500
DAY = 86400
# In a results folder: a folder of links to each day's results (UTC), which the prune reads.
BY_DAY = ".by-day"
# A batch removes at most this many results that are past their days: its work stays bounded.
PRUNE_MOST = 1000
# Error codes of a queue or table that does not exist, and of keys or permissions AWS refused:
# settings to fix, not outages. The batch exits 2 at start.
MISSING = ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "ResourceNotFoundException")
REFUSED_KEYS = ("InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch",
                "InvalidAccessKeyId", "ExpiredToken", "ExpiredTokenException", "AccessDenied",
                "AccessDeniedException")
# The DynamoDB errors of one item alone (too large, say): its job fails, the batch goes on.
REFUSED_ITEMS = ("ValidationException", "ItemCollectionSizeLimitExceededException")
# The errors of a results folder for one result alone: a file larger than the file system allows.
REFUSED_FILES = (errno.EFBIG, errno.ENAMETOOLONG)


class CallFailed(batchq_queue.QueueError):
    """A call to SQS or DynamoDB failed as a whole: the network, or the service."""


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
    parser.add_argument("--results-days", type=int, default=RESULTS_DAYS,
                        help="days a result is kept at least (0: for ever); at least the queue's retention")
    parser.add_argument("--profile", default="default", help="the section of the credentials file")


def check(args):
    """What is wrong with the SQS options; None when nothing is."""
    url = urlsplit(args.queue_url)
    if url.scheme not in ("http", "https") or not url.netloc or not url.path.strip("/"):
        return "--queue-url: must be the queue's URL, https://sqs.REGION.amazonaws.com/ACCOUNT/NAME, got %r" % (
            args.queue_url)
    if not LEAST_VISIBILITY <= args.visibility_timeout <= MOST_VISIBILITY:
        return "--visibility-timeout: must be from %d to %d seconds, got %s" % (
            LEAST_VISIBILITY, MOST_VISIBILITY, args.visibility_timeout)
    if not 1 <= args.wait_seconds <= MOST_WAIT:
        return "--wait-seconds: must be from 1 to %d, got %s" % (MOST_WAIT, args.wait_seconds)
    if args.backoff_max > MOST_VISIBILITY:
        return "--backoff-max: must be at most %d seconds (SQS's longest visibility), got %s" % (
            MOST_VISIBILITY, args.backoff_max)
    if not 0 <= args.results_days <= MOST_DAYS:
        return "--results-days: must be from 0 (for ever) to %d, got %s" % (MOST_DAYS, args.results_days)
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


def client(args, service="sqs", endpoint_url=None, wait=0, aws=None):
    """A client of service whose every call ends within CONNECT_SECONDS + READ_SECONDS, and wait
    more (a long poll's). A call is made once: a renewal that failed is made again at the next
    heartbeat, and any other failed call ends the batch, its messages back after their visibility.
    aws is the boto3 session to use (one for all of a batch's clients: each loads less)."""
    # retries' "mode" came with botocore 1.15: Debian 11's 1.20 has it. max_attempts counts retries.
    config = Config(retries={"max_attempts": 0, "mode": "standard"}, connect_timeout=CONNECT_SECONDS,
                    read_timeout=READ_SECONDS + wait)
    if service == "sqs":
        endpoint_url = args.endpoint_url
    try:
        return (aws or session(args)).client(service, endpoint_url=endpoint_url, config=config)
    except NoRegionError:
        raise ValueError("--region: no AWS region is set; give the queue's, e.g. --region eu-west-1") from None


def backend(args):
    """The backend of the options; exits 2 with one line on a setting to fix (the region, the
    credentials, the queue, its redrive policy, the store of results), before any claim."""
    results = table = None
    if not args.results_table:
        results = args.results or os.path.join(os.environ["STATE_DIRECTORY"].split(":")[0], "results")
    try:
        aws = session(args)
        sqs_client = client(args, aws=aws)
        poller = client(args, wait=SLICE, aws=aws)
        if args.results_table:
            table = ResultsTable(client(args, "dynamodb", args.table_endpoint_url, aws=aws), args.results_table,
                                 args.results_days)
    except ValueError as exc:  # no region, or a credential file without the keys: a setting to fix
        print("batchq-sqs: error: %s" % exc, file=sys.stderr)
        sys.exit(2)
    sqs = SQSBackend(sqs_client, args.queue_url, results, args.visibility_timeout, args.wait_seconds, table=table,
                     poller=poller, results_days=args.results_days)
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


def retention_problem(attributes, days):
    """What is wrong with --results-days for the queue; None when nothing is. A result must outlive
    its message: a message whose delete was lost comes back as long as SQS keeps it."""
    kept = int(attributes.get("MessageRetentionPeriod", "0"))
    if days and days * DAY < kept:
        return "--results-days: %d days is shorter than the queue keeps a message (%d s): a message " \
               "whose delete was lost could run again after its result was pruned" % (days, kept)
    return None


def setting(failure, missing):
    """The setting to fix that failure (a CallFailed) shows: missing when the queue or table does
    not exist. Raises failure again when it shows none: then it is an outage."""
    cause = failure.__cause__
    if isinstance(cause, NoCredentialsError):
        return "no AWS credentials: give the credential aws ($CREDENTIALS_DIRECTORY/aws, a shared-credentials " \
               "file) or an instance role"
    code = cause.response.get("Error", {}).get("Code") if isinstance(cause, ClientError) else None
    if code in MISSING:
        return missing
    if code in REFUSED_KEYS:
        return "AWS refused the keys or their permissions: check the credential aws and its IAM policy (%s)" % (
            batchq_queue.clean_text(str(cause)))
    raise failure


def call(made, name, what, **params):
    """made.name(**params); raises CallFailed, whose cause is botocore's error."""
    try:
        return getattr(made, name)(**params)
    except (BotoCoreError, ClientError) as exc:
        raise CallFailed("%s%s: %s" % (name, what, exc)) from exc


class ResultsTable:
    """Results in a DynamoDB table that every host shares, one item per message id, written once.
    Each item holds expires_at, days after its put (none when days is 0): the table's time to live
    deletes it after then."""

    def __init__(self, dynamodb, name, days=RESULTS_DAYS, wall=time.time):
        self.dynamodb = dynamodb
        self.name = name
        self.days = days
        self.wall = wall

    def call(self, name, **params):
        return call(self.dynamodb, name, " " + self.name, **params)

    def problem(self):
        """What is wrong with the table; None when nothing is."""
        try:
            table = self.call("describe_table", TableName=self.name)["Table"]
        except CallFailed as exc:
            return setting(exc, "--results-table: no table %s in this region; make it (partition key %s, "
                                "a string)" % (self.name, TABLE_KEY))
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
        """Store the result unless one is there already; False when one was. Raises Refused when
        DynamoDB refuses this item alone (more than 400 KB), with nothing stored."""
        now = int(self.wall())
        item = {TABLE_KEY: {"S": key}, "result": {"S": text}, "queue_url": {"S": queue_url},
                "stored_at": {"N": str(now)}}
        if self.days:
            item[EXPIRES] = {"N": str(now + self.days * DAY)}
        try:
            self.call("put_item", TableName=self.name, Item=item,
                      ConditionExpression="attribute_not_exists(%s)" % TABLE_KEY)
        except CallFailed as exc:
            cause = exc.__cause__
            code = cause.response.get("Error", {}).get("Code") if isinstance(cause, ClientError) else None
            if code == "ConditionalCheckFailedException":
                return False  # a second delivery: the first result stays
            if code in REFUSED_ITEMS:
                raise batchq_queue.Refused(str(exc)) from exc
            raise
        return True


def as_text(attributes):
    """A message's attributes as its job sees them, name to text: a String's or Number's value
    (of a custom type too, String.x), a Binary's bytes in base64."""
    texts = {}
    for name, attribute in attributes.items():
        if attribute.get("DataType", "").split(".")[0] == "Binary":
            texts[name] = base64.b64encode(attribute.get("BinaryValue", b"")).decode("ascii")
        else:
            texts[name] = attribute.get("StringValue", "")
    return texts


class SQSBackend(batchq_queue.Backend):
    """results is the folder of results, or None with table, a ResultsTable. poller is the client of
    the claim's receives (its read timeout allows for their wait), by default sqs. A result is kept
    results_days (0: for ever): the folder's are pruned after, and setup() refuses fewer days than
    the queue keeps a message. wall is the clock of the days."""

    def __init__(self, sqs, queue_url, results, visibility, wait, now=time.monotonic, table=None,
                 poller=None, results_days=RESULTS_DAYS, wall=time.time):
        self.sqs = sqs
        self.poller = poller or sqs
        self.url = queue_url
        self.results = results
        self.table = table
        self.visibility = visibility
        self.wait = wait
        self.now = now
        self.days = results_days
        self.wall = wall
        self.fifo = False
        self.dlq_url = None
        self.handles = {}      # message id: its latest receipt handle
        self.hidden_at = {}    # message id: when its visibility was last set
        self.received_at = {}  # message id: its first receive in this batch
        self.sent = {}         # message id: its message attributes, as received
        self.deletes = []      # message ids to delete: a full group of 10 at once, the rest at finish
        self.lost = set()      # message ids whose visibility SQS refused to change: not renewed again

    def call(self, name, made=None, **params):
        return call(made or self.sqs, name, "", **params)

    def setup(self, max_attempts):
        """What is wrong with the queue, its dead-letter queue or the store of results, a setting to
        fix; None when nothing is. Raises QueueError when SQS or DynamoDB is out of reach."""
        try:
            attributes = self.call("get_queue_attributes", QueueUrl=self.url, AttributeNames=["All"])["Attributes"]
        except CallFailed as exc:
            return setting(exc, "--queue-url: no queue %s; check its name, account and region" % self.url)
        problem = redrive_problem(attributes, max_attempts) or retention_problem(attributes, self.days)
        if problem:
            return problem
        self.fifo = attributes.get("FifoQueue") == "true"
        arn = json.loads(attributes["RedrivePolicy"])["deadLetterTargetArn"].split(":")
        try:
            self.dlq_url = self.call("get_queue_url", QueueName=arn[5], QueueOwnerAWSAccountId=arn[4])["QueueUrl"]
        except CallFailed as exc:
            return setting(exc, "the redrive policy's dead-letter queue %s does not exist; make it, or fix the "
                                "policy" % arn[5])
        if self.table:
            return self.table.problem()
        try:
            os.makedirs(self.results, exist_ok=True)
        except OSError as exc:
            return "--results: cannot make the folder %s: %s" % (self.results, exc.strerror)
        return None

    def claim(self, limit):
        self.prune()
        jobs = {}
        slices = max(1, self.wait // SLICE)  # the long poll's slices left
        # No receive after a SIGTERM: it would charge an attempt to messages the batch gives back.
        while len(jobs) < limit and not batchq_queue.TERM["asked"]:
            most = 1 if self.fifo else min(MOST_MESSAGES, limit - len(jobs))
            messages = self.receive(most, SLICE if slices else 0)
            if messages:
                slices = 0  # the receives after it do not wait
                self.hold(jobs, messages)
            elif slices > 1:
                slices -= 1
            else:
                break  # after the long poll: empty; after a short receive: no more for now
        return list(jobs.values())

    def receive(self, most, wait):
        reply = self.call("receive_message", self.poller, QueueUrl=self.url, MaxNumberOfMessages=most,
                          WaitTimeSeconds=wait, VisibilityTimeout=self.visibility,
                          AttributeNames=["ApproximateReceiveCount", "MessageGroupId"], MessageAttributeNames=["All"])
        return reply.get("Messages", [])

    def hold(self, jobs, messages):
        """Add the jobs of messages, just received, to jobs."""
        now = self.now()
        for message in messages:
            key = message["MessageId"]
            self.handles[key] = message["ReceiptHandle"]  # a second receive of it: only this handle works
            self.hidden_at[key] = now
            self.received_at.setdefault(key, now)
            self.sent[key] = message.get("MessageAttributes", {})
            attributes = message.get("Attributes", {})
            jobs[key] = batchq_queue.Job(key, message.get("Body", ""),
                                         int(attributes.get("ApproximateReceiveCount", "1")),
                                         group=attributes.get("MessageGroupId"), attributes=as_text(self.sent[key]))

    def keep_alive(self, jobs):
        now = self.now()
        # A done or dead message waits for its delete: until then it must stay hidden too.
        keys = [job.id for job in jobs] + self.deletes
        due = [key for key in keys if key not in self.lost and now - self.hidden_at[key] >= self.visibility / 2.0]
        due.sort(key=self.hidden_at.get)  # the longest hidden first
        try:
            self.set_visibility(due, self.visibility)
        except CallFailed:
            # The next heartbeat tries again, while the messages are hidden still. Once one may be
            # back in the queue, another consumer may take it: then the batch has failed.
            if any(self.now() - self.hidden_at[key] >= self.visibility for key in due):
                raise

    def set_visibility(self, keys, seconds):
        """Set the visibility of every message in keys, 10 a call. Raises QueueError once for the
        messages SQS refused, which are not renewed again (a stale handle, or back in the queue).
        Raises CallFailed at the first call that failed: the network would hold the next ones as long."""
        refused = []
        for start in range(0, len(keys), MOST_MESSAGES):
            part = keys[start:start + MOST_MESSAGES]
            entries = [{"Id": str(number), "ReceiptHandle": self.handles[key], "VisibilityTimeout": seconds}
                       for number, key in enumerate(part)]
            now = self.now()
            reply = self.call("change_message_visibility_batch", QueueUrl=self.url, Entries=entries)
            for entry in reply.get("Successful", []):
                self.hidden_at[part[int(entry["Id"])]] = now
            for entry in reply.get("Failed", []):
                key = part[int(entry["Id"])]
                self.lost.add(key)
                refused.append("%s: %s" % (key, entry.get("Code")))
        if refused:
            # The first few say what went wrong; the error stays short however many failed.
            raise batchq_queue.QueueError("change_message_visibility_batch: %d failed: %s" % (
                len(refused), "; ".join(refused[:3])))

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
            stored = self.table.put(job.id, result, self.url) if self.table else self.store(job, result)
            if not stored:
                print("batchq-sqs: %s: another delivery's result is stored already: this one is dropped" % job.id,
                      file=sys.stderr)
        self.delete_later(job.id)

    def store(self, job, result):
        """Write the result to the folder, and link it in today's folder of BY_DAY for the prune.
        Raises Refused for a result too large for the file system, with nothing stored."""
        day = os.path.join(self.results, BY_DAY, time.strftime("%Y-%m-%d", time.gmtime(self.wall())))
        try:
            return write_once(self.result_path(job), result, day if self.days else None)
        except OSError as exc:
            if exc.errno in REFUSED_FILES:
                raise batchq_queue.Refused("the result of %s: %s" % (job.id, exc)) from exc
            # A full disk, say: no result can be stored, and the job stays on the queue.
            raise batchq_queue.QueueError("the result of %s: %s" % (job.id, exc)) from exc

    def prune(self):
        """Remove the folder's results stored more than --results-days ago, PRUNE_MOST at most: a batch's
        work stays bounded however many are due. A day's folder of links goes when it is empty."""
        if self.table or not self.days:
            return
        try:
            self.prune_days()
        except OSError as exc:  # the batch goes on: its results are kept longer, that is all
            print("batchq-sqs: the prune of %s failed: %s" % (self.results, exc), file=sys.stderr)

    def prune_days(self):
        by_day = os.path.join(self.results, BY_DAY)
        # A day before the one of days ago ended more than days ago, and so did all its results.
        last = time.strftime("%Y-%m-%d", time.gmtime(self.wall() - self.days * DAY))
        try:
            due = sorted(name for name in os.listdir(by_day) if name < last)
        except FileNotFoundError:
            return
        left = PRUNE_MOST
        for name in due:
            folder = os.path.join(by_day, name)
            try:
                with os.scandir(folder) as entries:
                    names = [entry.name for entry in itertools.islice(entries, left)]
            except FileNotFoundError:  # another batch removed it
                continue
            for result in names:
                remove_result(os.path.join(self.results, result), os.path.join(folder, result))
            left -= len(names)
            if not left:
                return
            with contextlib.suppress(OSError):  # gone already, or not empty: a later prune tries again
                os.rmdir(folder)

    def failed(self, job, error, delay):
        in_flight = self.now() - self.received_at[job.id]
        seconds = max(0, min(int(math.ceil(delay)), MOST_VISIBILITY - int(math.ceil(in_flight)) - 1))
        self.call("change_message_visibility", QueueUrl=self.url, ReceiptHandle=self.handles[job.id],
                  VisibilityTimeout=seconds)
        self.hidden_at[job.id] = self.now()

    def dead(self, job, error):
        body = job.payload or "(empty)"
        params = {"QueueUrl": self.dlq_url, "MessageBody": body,
                  "MessageAttributes": dead_attributes(len(body.encode("utf-8")), job, error, self.sent.get(job.id))}
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


def remove_result(path, link):
    """Remove a result and its day's link to it. A result stored again since (a second delivery
    after an earlier prune) is another file: it stays."""
    with contextlib.suppress(FileNotFoundError):
        if os.path.samefile(path, link):
            os.unlink(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link)


def attribute_bytes(name, attribute):
    """The bytes SQS counts for a message attribute: its name, type and value."""
    value = attribute.get("BinaryValue")
    if value is None:
        value = attribute.get("StringValue", "").encode("utf-8")
    return len(name.encode("utf-8")) + len(attribute["DataType"].encode("utf-8")) + len(value)


def dead_attributes(body_bytes, job, error, sent=None):
    """The attributes of a job's copy in the DLQ, beside a body of body_bytes: the producer's
    (sent, as received), then the batch's own that fit. The body and the producer's attributes are
    never cut: they are the job, and SQS took them together once. SQS allows 10 attributes, and
    counts the body and attributes together: the batch's own go in the order of OWN_ATTRIBUTES
    while they fit, the error cut to fit. A producer's attribute named as one of the batch's own
    (a copy sent back from the DLQ) gives way to the new one."""
    attributes = {}
    for name, attribute in (sent or {}).items():
        if name not in OWN_ATTRIBUTES:
            # The value and its type alone: a received attribute may hold empty lists as well.
            attributes[name] = {key: attribute[key] for key in ("DataType", "StringValue", "BinaryValue")
                                if key in attribute}
    room = MOST_BYTES - body_bytes - sum(attribute_bytes(name, value) for name, value in attributes.items())
    wanted = [("batchq-message-id", "String", job.id), ("batchq-attempts", "Number", str(job.attempts)),
              ("batchq-error", "String", batchq_queue.clean_text(error) or "-")]
    for name, kind, value in wanted:
        if len(attributes) >= MOST_ATTRIBUTES:
            break
        left = room - len(name) - len(kind)
        if name == "batchq-error":
            # "ignore" drops a character cut in two: the value stays valid UTF-8.
            value = value.encode("utf-8")[:max(left, 0)].decode("utf-8", "ignore")
        size = len(value.encode("utf-8"))
        if value and size <= left:
            attributes[name] = {"DataType": kind, "StringValue": value}
            room = left - size
    return attributes


def write_once(path, text, day=None):
    """Write text to path unless path exists: a synced temporary file, then link() (never replaces).
    True when it wrote. The new file gets a second link in the folder day, which the prune reads
    (not synced: a link lost in a crash leaves a result to prune by hand)."""
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
        if day:
            os.makedirs(day, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # left by a result of this message pruned by hand
                os.link(temporary, os.path.join(day, os.path.basename(path)))
        return True
    finally:
        os.unlink(temporary)
