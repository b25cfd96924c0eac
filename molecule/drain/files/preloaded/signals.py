"""A Python consumer whose module (graceful) sets up signals and a random
generator at import, run with that module preloaded and without
(test_preload.py): each batch writes down the handlers and the signal mask it
found and the first numbers it drew, then exits 75 twice, and 0."""
import json
import os
import random
import signal
import sys

PRELOADED = "graceful" in sys.modules  # imported by the runner before this script ran

import graceful  # noqa: E402  pylint: disable=wrong-import-position

NAMES = (signal.SIGTERM, signal.SIGUSR1, signal.SIGALRM)


def name(handler):
    """A handler's name: SIG_DFL, SIG_IGN or its function's."""
    return handler.name if isinstance(handler, signal.Handlers) else getattr(handler, "__qualname__", repr(handler))


def main():
    number = int(os.environ["BATCHQ_BATCH"])
    found = {
        "batch": number, "preloaded": PRELOADED,
        "handlers": {signum.name: name(signal.getsignal(signum)) for signum in NAMES},
        "mask": sorted(signal.Signals(signum).name for signum in signal.pthread_sigmask(signal.SIG_BLOCK, ())),
        "own": graceful.OWN.random(), "global": random.random(),
    }
    with open(os.path.join(os.environ["STATE_DIRECTORY"], "batches.jsonl"), "a") as log:
        log.write(json.dumps(found) + "\n")
    sys.exit(75 if number < 3 else 0)


if __name__ == "__main__":
    main()
