# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The daemons of benchmarks/sqs.sh: one long-lived process drains an SQS queue, then exits.

Usage: sqs_daemon.py [--bare] BATCHQ-SQS-OPTIONS...

It takes batchq-sqs's options and ends when the queue is empty.

Without --bare: batchq-sqs's own batch (batchq_queue.run_batch with the
stand-in, a child process per job, a result file per job) again and again
in one process, while a batch exits the backlog code. The process, boto3's
import, the client and the queue's check come once. So this daemon differs
from batchq-sqs only in what a fresh process per batch costs.

With --bare: a plain SQS worker. Each ReceiveMessage asks for 10 messages
and waits up to --wait-seconds. Each message gets --work-ms of sleep in
this process, with no child process and no result file. The batch goes in
one DeleteMessageBatch. It ends at the first receive that returns nothing.

Prints the counts as one JSON line on standard error.
"""

import argparse
import json
import os
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(TOP, "examples", "queue_library"), os.path.join(TOP, "examples", "sqs_queue")]

import batchq_queue  # noqa: E402
import batchq_sqs  # noqa: E402


def options(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bare", action="store_true", help="a plain receive, sleep, delete loop")
    batchq_queue.add_common_options(parser)
    batchq_sqs.add_options(parser)
    args = parser.parse_args(argv)
    problem = batchq_queue.option_problem(args) or batchq_sqs.check(args)
    if problem:
        parser.exit(2, "sqs_daemon.py: error: %s\n" % problem)
    return args


def library_loop(args):
    """batchq-sqs's batch in a loop, in one process: the exit code of the last batch."""
    backend = batchq_sqs.backend(args)
    process = batchq_queue.stand_in(args)
    batches = 0
    while True:
        code = batchq_queue.run_batch(backend, process, args)
        batches += 1
        if code != args.backlog_exit_code:
            print(json.dumps({"daemon": "library", "batches": batches, "exit": code}), file=sys.stderr)
            return code


def bare_loop(args):
    """Receive 10, sleep --work-ms each, delete them in one call; until a receive returns nothing."""
    sqs = batchq_sqs.client(args)
    counts = {"daemon": "bare", "receives": 0, "done": 0}
    while True:
        messages = sqs.receive_message(QueueUrl=args.queue_url, MaxNumberOfMessages=batchq_sqs.MOST_MESSAGES,
                                       WaitTimeSeconds=args.wait_seconds,
                                       VisibilityTimeout=args.visibility_timeout).get("Messages", [])
        counts["receives"] += 1
        if not messages:
            print(json.dumps(counts), file=sys.stderr)
            return 0
        for _message in messages:
            time.sleep(args.work_ms / 1000.0)
        entries = [{"Id": str(number), "ReceiptHandle": message["ReceiptHandle"]}
                   for number, message in enumerate(messages)]
        failed = sqs.delete_message_batch(QueueUrl=args.queue_url, Entries=entries).get("Failed")
        if failed:
            print("sqs_daemon.py: not deleted: %s" % failed, file=sys.stderr)
            return 1
        counts["done"] += len(messages)


if __name__ == "__main__":
    ARGS = options(sys.argv[1:])
    sys.exit(bare_loop(ARGS) if ARGS.bare else library_loop(ARGS))
