"""What a preloading runner imports once per run: slow to import (a stand-in
for a web framework), with globals that its batches change."""
import os
import time

time.sleep(float(os.environ.get("HEAVY_IMPORT_SECONDS", "1")))
IMPORTED_BY = os.getpid()
IMPORTED_AT = time.time()
SEEN = []
LEAK = None
VERSION = 1
