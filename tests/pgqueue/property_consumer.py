"""A consumer of batchq_pgqueue whose jobs do what their payload says, for test_property.py.

Built as the writing guide says a consumer of your own is: the library and
the backend from /usr/local/lib/batchq-queue, process(job) of its own. A
payload is {"i": INDEX, "do": [KIND, ...]}; each job done appends INDEX to
--runs. Texts travel as hex of their UTF-8 (lone surrogates passed through):
jsonb holds neither a NUL nor a lone surrogate.
"""

import json
import os
import signal
import sys
import time

sys.path.insert(0, "/usr/local/lib/batchq-queue")

import batchq_pgqueue  # noqa: E402


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("a __str__ that fails")


EXCEPTIONS = [ValueError, KeyError, RuntimeError, SystemExit, KeyboardInterrupt, MemoryError, GeneratorExit,
              BadStr, UnicodeError]


def text(hex_text):
    return "x" * (1 << 20) if hex_text == "huge" else bytes.fromhex(hex_text).decode("utf-8", "surrogatepass")


def make_process(args):
    runs = os.environ["PROPERTY_RUNS"]

    def process(job):
        payload = json.loads(job.payload)  # a payload Python cannot decode fails here, in its job
        kind, *rest = payload["do"]
        if kind == "flood":
            sys.stdout.write("o" * (1 << 20))
            sys.stderr.write("e" * (1 << 20))
        elif kind == "flaky" and job.attempts <= rest[0]:
            raise ConnectionError("down for attempt %d" % job.attempts)
        elif kind == "raise":
            raise EXCEPTIONS[rest[0]](text(rest[1]))
        elif kind == "notjson":
            return {"set": {1}, "nan": float("nan"), "object": object(), "bytes": b"x", "inf": [float("inf")]}[rest[0]]
        elif kind == "oddresult":
            return text(rest[0])  # a text PostgreSQL's text cannot hold: the database refuses the result
        elif kind == "segv":
            import resource  # pylint: disable=import-outside-toplevel
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.kill(os.getpid(), signal.SIGSEGV)
        elif kind == "hang":
            time.sleep(600)
        with open(runs, "a") as handle:  # one write of a short line: whole, whatever runs beside it
            handle.write("%d\n" % payload["i"])
        return {"i": payload["i"]}
    return process


if __name__ == "__main__":
    sys.exit(batchq_pgqueue.main(sys.argv[1:], make_process))
