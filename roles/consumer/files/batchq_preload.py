# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preload fork server of the drain runner (batchq-drain --preload). Part
of batchq-drain, installed beside it.

With preload, the runner runs under the consumer's own Python, the command is
SCRIPT ARGS or -m MODULE ARGS, and each batch is a fork of the runner after
it imported the consumer's preload modules once: the batch skips the
interpreter's start and those imports (about 0.1 s for psycopg, seconds for a
web framework), and still starts from the same state every time, in a process
of its own. From the second batch the runner starts on, the next batch is
forked and set up while the one before it runs, and waits; it runs when that
one has ended leaving work waiting (none of its code runs before), and ends
unrun otherwise. The runner refuses to fork a module that started a thread or
opened a socket at import (the child would have the socket but not the
thread), and re-executes itself, fresh imports and all, before the next batch
once a file of what it imported has changed (an upgrade without a deploy).

A forked batch starts with what `python3 SCRIPT` would have after its
imports, and nothing of the runner's own: not its modules (never in
sys.modules after batchq-drain's import_beside()), not its atexit handlers. Its handlers of SIGTERM, SIGUSR1 and SIGALRM and its signal mask
are those the preloaded modules left (batchq_supervise.Signals); its random
state is its own (batchq_reseed.py). It runs its program and ends as
python3 would (batchq_main.py).
"""

import gc
import importlib
import os
import sys
import time

import batchq_cpython
import batchq_reseed
from batchq_main import PATH0, SCRIPT, compile_script, file_identity, python_path_of, run_as_main
from batchq_supervise import SIGNALS, Starter, batch_environment

# How often a preloading runner looks whether a file it imported changed.
CODE_CHECK_SECONDS = 1.0
# A forked batch's oom_score_adj over the runner's: under memory_max, the
# kernel kills the batch that grew, not the runner whose imports it shares.
OOM_SCORE_RAISE = 500


def preload(modules, target):
    """Import modules as the batch would, with its sys.path; returns what a
    fork-safe import refused, naming the module, or None."""
    first = python_path_of(target)
    if first is not None:
        sys.path.insert(0, first)
        PATH0["set"] = True
    runner_sockets = open_sockets()
    for name in modules:
        try:
            importlib.import_module(name)
        # a SystemExit too: it would end the run unsaid
        except BaseException as exc:  # pylint: disable=broad-except
            import traceback  # pylint: disable=import-outside-toplevel
            traceback.print_exc()
            return "importing %s failed: %s: %s" % (name, type(exc).__name__, exc)
        hazard = fork_hazard(runner_sockets)
        if hazard:
            return "importing %s %s; leave %s out of preload, or make it do that on first use" % (
                name, hazard, name)
    return None


def after_preload(target, runner_fds, runner_files):
    """The Forker of a run whose preload() refused nothing. Right after the
    imports: what they left is what each batch gets. runner_files: the
    runner's own modules' files, which are not in sys.modules."""
    SIGNALS.preloaded()
    batchq_reseed.find()
    forker = Forker(target, runner_fds, runner_files)
    # The preloaded objects live as long as the runner: the collector of
    # each batch leaves them be. A full collection would walk, and so copy
    # into the batch, every page of them: 12 ms a batch with psycopg.
    gc.freeze()
    return forker


def open_sockets():
    """The file descriptors of this process that are sockets."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + fd).startswith("socket:"):
                found.add(int(fd))
        except OSError:
            pass  # the descriptor of the listing itself, closed by now
    return found


def fork_hazard(runner_sockets):
    """What this process holds that a fork would break: threads beyond this one
    (the child would have none of them) or sockets other than the runner's own
    (its stdio, a journal stream, and its journal socket): a connection that
    every batch would share; None if neither."""
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        return "started %s, which a forked batch would not have" % (
            "a thread" if threads == 2 else "%d threads" % (threads - 1))
    sockets = sorted(open_sockets() - runner_sockets)
    if sockets:
        return "opened %s (file descriptor %s), which every forked batch would share with the runner" % (
            "a socket" if len(sockets) == 1 else "%d sockets" % len(sockets), ", ".join(map(str, sockets)))
    return None


class CodeWatch:
    """The files of every module this runner imported (the preload's and what
    they import, the standard library and the runner's own too), and where the
    batch's script leads (a release symlink): has one of them changed?"""

    def __init__(self, target, runner_files=()):
        self.files = {path: file_identity(path) for path in runner_files}
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None)
            if isinstance(path, str):
                self.files[path] = file_identity(path)
        self.script = None if target[0] == "-m" else target[0]
        self.script_leads_to = self.script and os.path.realpath(self.script)
        self.next_check = time.monotonic() + CODE_CHECK_SECONDS

    def changed(self):
        """What changed since the import, at most once per CODE_CHECK_SECONDS; or None."""
        if time.monotonic() < self.next_check:
            return None
        self.next_check = time.monotonic() + CODE_CHECK_SECONDS
        if self.script and os.path.realpath(self.script) != self.script_leads_to:
            return "%s (it leads to %s now)" % (self.script, os.path.realpath(self.script))
        return next((path for path, identity in self.files.items() if file_identity(path) != identity), None)


class Forker(Starter):
    """Starts batches as forks of this runner running argv, and can make the
    next one ready while the one before it runs (ready()): forked, set up,
    waiting to be told to go. The fork, the set-up and the pages they copy
    are then no longer between two batches (1.1-1.6 ms a batch of
    benchmarks/drain.sh's Python consumer). A batch made ready runs only if the
    one before it leaves work waiting and the script is the file it was;
    otherwise it ends unrun (discard()). The code is stale once a file that
    the runner imported has changed (CodeWatch)."""

    def __init__(self, argv, runner_fds, runner_files=()):
        self.argv, self.runner_fds = argv, list(runner_fds)
        self.waiting = None  # (number, script identity, Forked, output, told: the go pipe's write end)
        self.watch = CodeWatch(argv, runner_files)

    def start(self, number):
        if self.waiting and self.waiting[:2] == (number, self.script_identity()):
            _number, _identity, child, output, told = self.waiting
            self.waiting = None
            try:
                os.write(told, b"g")
                return child, output
            except OSError:  # it died waiting (an OOM kill, say)
                child.wait()
                os.close(output)
            finally:
                os.close(told)
        self.discard()
        return self.fork(number, ())

    def ready(self, number, busy_fds):
        self.discard()
        try:
            go, told = os.pipe()
        except OSError:
            return  # no descriptor left: the batch is forked when due
        try:
            child, output = self.fork(number, list(busy_fds) + [told], go)
        except OSError:
            os.close(told)  # no task left under tasks_max, say: the batch is forked when due
            return
        finally:
            os.close(go)
        # the script's file as it was when compiled for this batch (fork_batch)
        identity = None if self.argv[0] == "-m" else SCRIPT["identity"]
        self.waiting = (number, identity, child, output, told)

    def ready_pids(self):
        return (self.waiting[2].pid,) if self.waiting else ()

    def discard(self):
        if self.waiting:
            _number, _identity, child, output, told = self.waiting
            self.waiting = None
            os.close(told)  # it ends unrun
            child.wait()
            os.close(output)

    def stale(self):
        return self.watch.changed()

    def fork(self, number, busy_fds, go=None):
        return self.piped(lambda into, output: fork_batch(
            self.argv, into, batch_environment(number), self.runner_fds + list(busy_fds) + [output], go))

    def script_identity(self):
        return None if self.argv[0] == "-m" else file_identity(os.path.abspath(self.argv[0]))


def exit_code(wait_status):
    """A wait status as Popen.returncode says it: the exit status, or minus the signal."""
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


class Forked:
    """A batch forked from this runner: what the relay needs of a Popen."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = exit_code(status)
        return self.returncode

    def wait(self):
        if self.returncode is None:
            self.returncode = exit_code(os.waitpid(self.pid, 0)[1])
        return self.returncode


def fork_batch(target, output, env, runner_fds, go=None):
    """Fork a batch that runs target as its __main__; returns a Forked. With
    go (a pipe's read end), the batch sets itself up, then waits for a byte on
    go before it runs, and exits unrun when go ends instead."""
    if target[0] != "-m":
        compile_script(os.path.abspath(target[0]))
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or the batch would write the runner's buffered output again
    pid = SIGNALS.fork()
    if pid:
        return Forked(pid)
    status = 1
    try:
        SIGNALS.batch()
        batchq_cpython.forget_exit_handlers()
        os.setsid()  # its own process group, for the timeout
        raise_oom_score()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        for fd in set(runner_fds) | {null, output}:
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        batchq_reseed.reseed()  # after the dup2: a failure to is said among the batch's lines
        if go is not None:
            told = os.read(go, 1)
            os.close(go)
            if not told:
                os._exit(0)  # nothing of the batch ran: no handler, no flush
        status = run_as_main(target)
    except BaseException:  # pylint: disable=broad-except
        try:
            sys.excepthook(*sys.exc_info())
            sys.stderr.flush()
        except BaseException:  # pylint: disable=broad-except
            pass
    os._exit(status)


def raise_oom_score():
    """The batch's oom_score_adj, OOM_SCORE_RAISE over the runner's. With the
    os module's calls: Python's file objects would cost the batch about 1 ms,
    in pages of the runner it would touch and so copy."""
    try:
        handle = os.open("/proc/self/oom_score_adj", os.O_RDWR)
    except OSError:
        return  # no /proc: the kernel picks by size alone
    try:
        score = int(os.read(handle, 16))
        os.lseek(handle, 0, os.SEEK_SET)
        os.write(handle, b"%d" % min(1000, score + OOM_SCORE_RAISE))
    except (OSError, ValueError):
        pass
    finally:
        os.close(handle)
