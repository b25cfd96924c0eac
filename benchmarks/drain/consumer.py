#!/usr/bin/python3
"""The queue consumer of benchmarks/drain.sh in Python: consumer.c's batch,
line for line, for the rows of a Python consumer with and without preload.

Usage: consumer.py [--loop] QUEUE_DIR BATCH

QUEUE_DIR/items holds the number of items left. A batch takes up to BATCH of
them under flock(2), works 1 ms of busy CPU per item (each item ending at its
own deadline from the batch's start), appends "START_NS END_NS TAKEN" to
QUEUE_DIR/batches.log, prints one line and exits 75 when it took a full
batch, else 0; --loop runs batches in one process until one is not full (the
daemon). With $BENCH_IMPORT_SECONDS it first imports slowimport (next to it),
whose import takes that long: a stand-in for a web framework's.
"""
import fcntl
import os
import sys
import time

if os.environ.get("BENCH_IMPORT_SECONDS"):
    import slowimport  # noqa: F401  pylint: disable=unused-import

BACKLOG = 75
WORK_NS = 1000000


def take(queue, batch):
    fcntl.flock(queue, fcntl.LOCK_EX)
    left = int(os.pread(queue, 32, 0) or b"0")
    taken = max(0, min(left, batch))
    os.ftruncate(queue, 0)
    os.pwrite(queue, b"%d\n" % (left - taken), 0)
    fcntl.flock(queue, fcntl.LOCK_UN)
    return taken


def work(items):
    start = time.monotonic_ns()
    for i in range(1, items + 1):
        deadline = start + i * WORK_NS
        while time.monotonic_ns() < deadline:
            pass


def run_batch(queue, log, batch):
    started = time.time_ns()
    taken = take(queue, batch)
    work(taken)
    os.write(log, b"%d %d %d\n" % (started, time.time_ns(), taken))
    print("took %d items" % taken, flush=True)
    return taken


def main(args):
    loop = args[:1] == ["--loop"]
    folder, batch = args[loop], int(args[1 + loop])
    queue = os.open(os.path.join(folder, "items"), os.O_RDWR | os.O_CLOEXEC)
    log = os.open(os.path.join(folder, "batches.log"), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    if not loop:
        return BACKLOG if run_batch(queue, log, batch) == batch else 0
    while run_batch(queue, log, batch) == batch:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
