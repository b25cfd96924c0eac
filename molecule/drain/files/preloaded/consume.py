#!/usr/bin/python3
"""A Python consumer that a preloading runner forks (test_preload.py).

Each batch writes down what it found of its process and of the module the
runner preloaded (heavy), then does what $STATE_DIRECTORY/plan.json says for
its batch number ({"2": "raise", "default": "exit:75"}): exit:N, raise,
signal:N, leak:MB (then exit 75), oom, hang, thread (a thread that records
after the batch's main code ends), children:N (forks N that sleep), sleep:S
(then exit 75).
"""
import atexit
import gc
import json
import os
import random
import sys
import threading
import time

import heavy

STATE = os.environ["STATE_DIRECTORY"]
LEFT_OPEN = None


def record(**fields):
    with open(os.path.join(STATE, "batches.jsonl"), "a") as log:
        log.write(json.dumps(fields) + "\n")


def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def oom_score_adj(pid="self"):
    with open("/proc/%s/oom_score_adj" % pid) as handle:
        return int(handle.read())


def plan(number):
    try:
        with open(os.path.join(STATE, "plan.json")) as handle:
            steps = json.load(handle)
    except FileNotFoundError:
        return "exit:0"
    return steps.get(str(number), steps.get("default", "exit:0"))


def children(count):
    """Fork count children that sleep; how many forks the kernel refused."""
    refused = 0
    for _child in range(count):
        try:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
        except OSError:
            refused += 1
    return refused


class Cycle:
    """An object only the garbage collector frees (it refers to itself)."""

    def __init__(self, number):
        self.itself, self.number = self, number

    def __del__(self):
        record(event="cycle-collected", batch=self.number)


def main():
    number = int(os.environ["BATCHQ_BATCH"])
    Cycle(number)  # garbage at once: the batch's collector must free it, frozen preload or not
    action = plan(number)
    record(event="start", batch=number, time=time.time(), pid=os.getpid(), own_group=os.getpgrp() == os.getpid(),
           argv=sys.argv, path0=sys.path[0], file=__file__, imported_by=heavy.IMPORTED_BY,
           imported_at=heavy.IMPORTED_AT, seen=list(heavy.SEEN), version=heavy.VERSION, random=random.random(),
           rss_kib=rss_kib(), frozen=gc.get_freeze_count(), invocation=os.environ.get("INVOCATION_ID"), action=action,
           oom_score_adj=oom_score_adj(), runner_oom_score_adj=oom_score_adj(os.getppid()))
    # what every batch leaves behind in the module: the next must not see it
    heavy.SEEN.append(number)
    print("batch %d says hello on stdout" % number)
    print("batch %d says hello on stderr" % number, file=sys.stderr)
    atexit.register(record, event="atexit", batch=number)
    # left open, as careless code does: the interpreter's exit flushes it
    global LEFT_OPEN  # pylint: disable=global-statement
    LEFT_OPEN = open(os.path.join(STATE, "left-open-%d.txt" % number), "w")
    LEFT_OPEN.write("batch %d\n" % number)
    what, value = (action.split(":", 1) + [""])[:2]
    if what == "exit":
        sys.exit(int(value))
    if what == "raise":
        raise RuntimeError("batch %d raises" % number)
    if what == "signal":
        os.kill(os.getpid(), int(value))
    if what == "leak":
        heavy.LEAK = bytearray(int(value) * 1024 * 1024)  # touched: zero-filled pages in use
        for offset in range(0, len(heavy.LEAK), 4096):
            heavy.LEAK[offset] = 1
    if what == "oom":
        hoard = []
        while True:
            hoard.append(b"x" * (16 * 1024 * 1024))
    if what == "hang":
        time.sleep(600)
    if what == "thread":
        def late():
            time.sleep(0.5)
            record(event="thread", batch=number)
        threading.Thread(target=late).start()
    if what == "children":
        record(event="children", batch=number, refused=children(int(value)))
    if what == "sleep":
        time.sleep(float(value))
    sys.exit(75)


if __name__ == "__main__":
    main()
