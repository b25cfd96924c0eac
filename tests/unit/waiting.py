"""The one wait of every test tree: a condition polled until it holds, or a failure after a deadline.

molecule/testlib.py, tests/queues, tests/pgqueue and tests/unit import it.
It lives in tests/unit because the unit tests find it there without a path of
their own (pytest puts the folder of their conftest.py on sys.path), and
because no tarball ships it (galaxy.yml's build_ignore drops tests/unit). The
other trees put this folder on sys.path. It needs the standard library alone:
each tree runs in a venv of its own.
"""

import time

# The longest text of the last value that a failure shows.
SHOWN_CHARS = 2000


def wait_for(condition, timeout, what, interval=0.1, explain=None):
    """condition()'s first truthy value, polled every interval seconds.

    Fails with an AssertionError once timeout seconds have passed: the message
    names what was awaited and shows the last value condition() returned, then
    what explain() returns, if given (a journal, say). condition() is called
    once more at the deadline. An exception that condition() raises ends the
    wait at once: a condition raises when what it waits for can no longer come.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            shown = repr(value)
            if len(shown) > SHOWN_CHARS:
                shown = shown[:SHOWN_CHARS] + "... (%d characters)" % len(shown)
            raise AssertionError("waited %gs in vain for %s; last seen: %s%s"
                                 % (timeout, what, shown, explain() if explain else ""))
        time.sleep(min(interval, left))
