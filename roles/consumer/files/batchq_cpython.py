# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the python3 command does around a program that no public API does:
the CPython internals the drain runner uses, here and nowhere else. Part of
batchq-drain, installed beside it.

A preloaded batch (batchq_preload.py) is a fork of the runner that must start
and end as `python3 SCRIPT` or `python3 -m MODULE` would. It runs deep in the
runner's call stack, so it ends by os._exit(): a normal exit would unwind
through the runner's own frames and finalize the runner's interpreter. The
batch therefore does the interpreter's exit steps itself, in the order of
Py_FinalizeEx() (Python/pylifecycle.c): the threads, then the atexit handlers.

Each function names the private call it makes and why no public one does the
job. tests/unit/test_batchq_drain.py runs a preloaded drain through all of
them under each CPython from 3.9 to 3.14 found on the machine; the drain
scenario does it on Debian 11 to testing.
"""

import atexit
import runpy
import sys


# run_module_as_main(name): run module name in the __main__ module, as
# `python3 -m NAME` does; a module that cannot be found exits with python3's
# message and status 1. runpy._run_module_as_main() is what `python3 -m`
# itself calls (Modules/main.c). The public runpy.run_module(name,
# run_name="__main__", alter_sys=True) runs the code in a temporary module
# instead of __main__, puts the old __main__ and sys.argv[0] back when it
# returns, and raises ImportError where python3 prints "No module named" and
# exits. The function itself, not a call in a function of this file: a
# traceback of the batch then shows runpy's frames, as python3's does, and
# none of the runner's.
run_module_as_main = runpy._run_module_as_main  # pylint: disable=protected-access


def forget_exit_handlers():
    """Drop every atexit handler registered so far: in a forked batch, those
    the runner and its preloaded modules registered (a temporary folder to
    remove, say) are the runner's to run, once, not each batch's."""
    # atexit._clear(): the public atexit.unregister(func) needs each function,
    # and atexit offers no way to list them.
    atexit._clear()  # pylint: disable=protected-access


def join_threads():
    """Wait for the batch's non-daemon threads and run threading's own exit
    callbacks, as the interpreter's exit does first."""
    threading = sys.modules.get("threading")  # none to wait for if the batch never imported it
    if threading is None or not hasattr(threading, "_shutdown"):
        return
    # threading._shutdown(): joining each thread of threading.enumerate() would
    # miss the callbacks that threading._register_atexit() keeps apart from
    # atexit's: concurrent.futures waits there for the work queued to its
    # executors, whose worker threads are daemon threads.
    threading._shutdown()  # pylint: disable=protected-access


def run_exit_handlers():
    """Run the atexit handlers the batch registered, as the interpreter's exit does."""
    # atexit._run_exitfuncs(): no public call runs them, and the batch never
    # reaches the interpreter's exit, which would.
    atexit._run_exitfuncs()  # pylint: disable=protected-access
