"""What benchmarks/drain/consumer.py imports when $BENCH_IMPORT_SECONDS is set:
an import that takes that long, as a web framework's does (busy CPU, as
imports are)."""
import os
import time

_deadline = time.monotonic() + float(os.environ["BENCH_IMPORT_SECONDS"])
while time.monotonic() < _deadline:
    pass
