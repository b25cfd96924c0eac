"""A strict fake of the SQS API, in memory, with a clock the test moves.

What only this fake checks (moto does not, or not exactly):
- every call's parameters against botocore's service model, and SQS's ranges
  (1-10 messages per receive and per batch, a wait of 0-20 s, a visibility
  of 0-43200 s, unique entry ids);
- stale receipt handles: only a message's latest handle works (moto takes an old one);
- ChangeMessageVisibility on a message not in flight is refused (moto takes it);
- visibility to the millisecond (moto counts whole seconds);
- a short receive (WaitTimeSeconds 0) that misses messages, when asked;
- a DeleteMessageBatch entry that fails once, when asked;
- FIFO groups: a group with a message in flight gives nothing;
- a message SQS refuses: a character outside XML 1.0's in its body or an
  attribute value, an empty String or Number value, more than 10 attributes,
  or a body and attributes of more than 256 KiB together;
- message attributes given back only when a receive asks for them
  (MessageAttributeNames), as SQS does.
What the tests check against moto instead: a whole drain through boto3 and
HTTP, redrive policies read at start, the dead-letter queue filled, the
property test's runs on a real (if lenient) SQS, and the DynamoDB results
table (--results-table): this fake is SQS alone, and moto's DynamoDB refuses
a second conditional put as DynamoDB does.
"""

import itertools
import json
import re
import time

import botocore.session
import botocore.validate
from botocore.exceptions import ClientError

MODEL = botocore.session.get_session().get_service_model("sqs")
ACCOUNT = "123456789012"
# The characters SQS takes in a body or an attribute value: XML 1.0's.
SQS_TEXT = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*\\Z")
# A message's body and attributes (names, types and values) together, in bytes.
MOST_BYTES = 262144
MOST_ATTRIBUTES = 10
# SQS's default MessageRetentionPeriod: 4 days.
RETENTION = 345600


def error(code, operation, message=""):
    return ClientError({"Error": {"Code": code, "Message": message or code}}, operation)


class Message:
    def __init__(self, number, body, group, attributes):
        self.id = "00000000-0000-4000-8000-%012d" % number
        self.number = number
        self.body = body
        self.group = group
        self.attributes = attributes
        self.receives = 0
        self.visible_at = 0
        self.handle = None


class Queue:
    def __init__(self, name, fifo, redrive, retention):
        self.name = name
        self.fifo = fifo
        self.redrive = redrive
        self.retention = retention
        self.messages = []


class FakeSQS:
    """The client methods batchq_sqs calls. ms is the clock, in milliseconds; now() in seconds."""

    def __init__(self, speed=1):
        # Real time, so that a job's child process and the heartbeat see it pass; advance() adds to it.
        # speed makes it pass faster: at 5, a second of real time is 5 seconds of the queue's.
        self.speed = speed
        self.start = time.monotonic()
        self.offset_ms = 0
        self.queues = {}
        self.calls = []
        self.numbers = itertools.count(1)
        self.handles = itertools.count(1)
        self.short_receives_miss = False
        self.fail_delete_once = set()

    @property
    def ms(self):
        return int((time.monotonic() - self.start) * 1000 * self.speed) + self.offset_ms

    def now(self):
        return self.ms / 1000.0

    def advance(self, seconds):
        self.offset_ms += int(round(seconds * 1000))

    def url(self, name):
        return "https://sqs.fake/%s/%s" % (ACCOUNT, name)

    def create_queue(self, name, dlq=None, max_receive=None, retention=RETENTION):
        redrive = None
        if dlq:
            redrive = {"deadLetterTargetArn": "arn:aws:sqs:eu-west-1:%s:%s" % (ACCOUNT, dlq),
                       "maxReceiveCount": max_receive}
        self.queues[self.url(name)] = Queue(name, name.endswith(".fifo"), redrive, retention)
        return self.url(name)

    def add(self, url, body, group=None, attributes=None):
        """A message as a producer sends it; attributes as SendMessage's MessageAttributes."""
        queue = self.queues[url]
        self.check_message("SendMessage", body, attributes or {})
        message = Message(next(self.numbers), body, group, dict(attributes or {}))
        queue.messages.append(message)
        return message

    # the checks

    def check(self, operation, params):
        self.calls.append((operation, params))
        report = botocore.validate.ParamValidator().validate(params, MODEL.operation_model(operation).input_shape)
        if report.has_errors():
            raise AssertionError(report.generate_report())
        if params["QueueUrl"] not in self.queues:
            raise error("AWS.SimpleQueueService.NonExistentQueue", operation)
        entries = params.get("Entries")
        if entries is not None:
            assert 1 <= len(entries) <= 10, "%s with %d entries" % (operation, len(entries))
            assert len({entry["Id"] for entry in entries}) == len(entries), "ids not unique"
            for entry in entries:
                if "VisibilityTimeout" in entry:
                    assert 0 <= entry["VisibilityTimeout"] <= 43200
        if "VisibilityTimeout" in params:
            assert 0 <= params["VisibilityTimeout"] <= 43200
        return self.queues[params["QueueUrl"]]

    def check_message(self, operation, body, attributes):
        """Raise as SQS does for a message it refuses."""
        if not body or not SQS_TEXT.match(body):
            raise error("InvalidParameterValue", operation, "the body is empty or has invalid characters")
        if len(attributes) > MOST_ATTRIBUTES:
            raise error("InvalidParameterValue", operation, "%d attributes, more than %d" % (
                len(attributes), MOST_ATTRIBUTES))
        size = len(body.encode("utf-8"))
        for name, attribute in attributes.items():
            size += len(name.encode("utf-8")) + len(attribute["DataType"].encode("utf-8"))
            if attribute["DataType"].split(".")[0] == "Binary":
                size += len(attribute.get("BinaryValue", b""))
                continue
            value = attribute.get("StringValue", "")
            if not value or not SQS_TEXT.match(value):
                raise error("InvalidParameterValue", operation, "attribute %s is empty or has invalid characters" % name)
            size += len(value.encode("utf-8"))
        if size > MOST_BYTES:
            raise error("InvalidParameterValue", operation, "the message has %d bytes, more than %d" % (size, MOST_BYTES))

    def in_flight(self, message):
        return message.handle is not None and message.visible_at > self.ms

    def by_handle(self, queue, handle, operation):
        for message in queue.messages:
            if message.handle == handle:
                return message
        raise error("ReceiptHandleIsInvalid", operation, "stale or unknown receipt handle %s" % handle)

    # the API

    def get_queue_attributes(self, **params):
        queue = self.check("GetQueueAttributes", params)
        attributes = {"FifoQueue": "true" if queue.fifo else "false",
                      "ApproximateNumberOfMessages": str(sum(not self.in_flight(m) for m in queue.messages)),
                      "MessageRetentionPeriod": str(queue.retention)}
        if queue.redrive:
            attributes["RedrivePolicy"] = json.dumps(queue.redrive)
        if not queue.fifo:
            del attributes["FifoQueue"]
        return {"Attributes": attributes}

    def get_queue_url(self, **params):
        self.calls.append(("GetQueueUrl", params))
        url = self.url(params["QueueName"])
        if url not in self.queues:
            raise error("AWS.SimpleQueueService.NonExistentQueue", "GetQueueUrl")
        return {"QueueUrl": url}

    def receive_message(self, **params):
        queue = self.check("ReceiveMessage", params)
        most = params.get("MaxNumberOfMessages", 1)
        wait = params.get("WaitTimeSeconds", 0)
        assert 1 <= most <= 10 and 0 <= wait <= 20
        if wait == 0 and self.short_receives_miss:
            return {}
        locked = {m.group for m in queue.messages if queue.fifo and self.in_flight(m)}
        given = []
        for message in list(queue.messages):
            if len(given) >= most:
                break
            if self.in_flight(message) or message.group in locked:
                if queue.fifo:
                    locked.add(message.group)  # later ones of its group wait behind it
                continue
            if queue.redrive and message.receives >= queue.redrive["maxReceiveCount"]:
                queue.messages.remove(message)
                self.queues[self.url(queue.redrive["deadLetterTargetArn"].split(":")[5])].messages.append(message)
                continue
            message.receives += 1
            message.handle = "handle-%d" % next(self.handles)
            message.visible_at = self.ms + 1000 * params.get("VisibilityTimeout", 30)
            reply = {"MessageId": message.id, "ReceiptHandle": message.handle, "Body": message.body,
                     "Attributes": dict({"ApproximateReceiveCount": str(message.receives)},
                                        **({"MessageGroupId": message.group} if message.group else {}))}
            if message.attributes and "All" in params.get("MessageAttributeNames", []):
                reply["MessageAttributes"] = dict(message.attributes)
            given.append(reply)
        return {"Messages": given} if given else {}

    def change_message_visibility(self, **params):
        queue = self.check("ChangeMessageVisibility", params)
        message = self.by_handle(queue, params["ReceiptHandle"], "ChangeMessageVisibility")
        if not self.in_flight(message):
            raise error("MessageNotInflight", "ChangeMessageVisibility")
        message.visible_at = self.ms + 1000 * params["VisibilityTimeout"]
        return {}

    def change_message_visibility_batch(self, **params):
        queue = self.check("ChangeMessageVisibilityBatch", params)
        ok, failed = [], []
        for entry in params["Entries"]:
            try:
                message = self.by_handle(queue, entry["ReceiptHandle"], "ChangeMessageVisibilityBatch")
                if not self.in_flight(message):
                    raise error("MessageNotInflight", "ChangeMessageVisibilityBatch")
            except ClientError as exc:
                failed.append({"Id": entry["Id"], "Code": exc.response["Error"]["Code"], "SenderFault": True})
                continue
            message.visible_at = self.ms + 1000 * entry.get("VisibilityTimeout", 0)
            ok.append({"Id": entry["Id"]})
        return {"Successful": ok, "Failed": failed}

    def delete_message_batch(self, **params):
        queue = self.check("DeleteMessageBatch", params)
        ok, failed = [], []
        for entry in params["Entries"]:
            try:
                message = self.by_handle(queue, entry["ReceiptHandle"], "DeleteMessageBatch")
            except ClientError:
                failed.append({"Id": entry["Id"], "Code": "ReceiptHandleIsInvalid", "SenderFault": True})
                continue
            if message.id in self.fail_delete_once:
                self.fail_delete_once.discard(message.id)
                failed.append({"Id": entry["Id"], "Code": "InternalError", "SenderFault": False})
                continue
            queue.messages.remove(message)
            ok.append({"Id": entry["Id"]})
        return {"Successful": ok, "Failed": failed}

    def send_message(self, **params):
        queue = self.check("SendMessage", params)
        if queue.fifo:
            assert params.get("MessageGroupId") and params.get("MessageDeduplicationId")
        self.check_message("SendMessage", params["MessageBody"], params.get("MessageAttributes", {}))
        message = Message(next(self.numbers), params["MessageBody"], params.get("MessageGroupId"),
                          params.get("MessageAttributes", {}))
        queue.messages.append(message)
        return {"MessageId": message.id}

    def bodies(self, url):
        return [message.body for message in self.queues[url].messages]
