"""What a preloading runner imports once per run: slow to import (a stand-in
for a web framework), with globals that its batches change."""
import atexit
import json
import os
import time

time.sleep(float(os.environ.get("HEAVY_IMPORT_SECONDS", "1")))
IMPORTED_BY = os.getpid()
IMPORTED_AT = time.time()
SEEN = []
LEAK = None
VERSION = 1


def _runner_exit():
    # once per run, when the runner ends: never in a batch
    with open(os.path.join(os.environ["STATE_DIRECTORY"], "batches.jsonl"), "a") as log:
        log.write(json.dumps({"event": "preload-atexit", "batch": "runner", "pid": os.getpid()}) + "\n")


atexit.register(_runner_exit)
