"""Runs a queue consumer program with process(job) in the batch's own process.

Usage: python3 benchmarks/queue_inline.py PROGRAM [ARGUMENT ...]

The baseline of benchmarks/queues.py: the same program, the same backend and
the same work, but no worker process. It gives up what the worker is for (a
crash or a hang of one job fails the whole batch), so it is for measuring
only, never for a consumer.
"""

import os
import runpy
import sys


def inline_workers(library):
    """A stand-in for the library's Workers that calls process(job) itself."""

    class InlineWorkers:
        def __init__(self, process, jobs):
            self.process = process
            self.jobs = jobs

        def run(self, index, _timeout, keep_alive, _heartbeat=None):
            kind, text = library._report(self.process, self.jobs[index])  # pylint: disable=protected-access
            keep_alive()
            return kind, text

        def close(self):
            pass

    return InlineWorkers


def main():
    program = os.path.realpath(sys.argv[1])
    here = os.path.dirname(program)
    # Where the reference programs look for the library: beside them, the collection's tree, the hosts' folder.
    sys.path[:0] = [here, os.path.join(here, "..", "queue_library"), "/usr/local/lib/batchq-queue"]
    import batchq_queue  # pylint: disable=import-outside-toplevel  # found only once the path is set
    batchq_queue.Workers = inline_workers(batchq_queue)
    sys.argv = sys.argv[1:]
    runpy.run_path(program, run_name="__main__")  # its own import finds the patched module


if __name__ == "__main__":
    main()
