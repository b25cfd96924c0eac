"""A module that sets up its process when imported, as real ones do
(test_preload.py): a graceful shutdown on SIGTERM, SIGUSR1 ignored, SIGALRM
and SIGUSR2 blocked until it wants them, a random generator of its own, and
a SystemRandom, which keeps no state to reseed. The unit tests of the drain
runner preload it too (tests/unit/test_batchq_drain.py)."""
import random
import signal
import sys


def graceful(signum, frame):
    sys.exit(75)


signal.signal(signal.SIGTERM, graceful)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGUSR2})
OWN = random.Random()
SYSTEM = random.SystemRandom()
