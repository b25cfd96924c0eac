# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One batch of a drain, from its start to its end: its timeout, the relay of
its output to the journal, what it leaves behind, and the signals of the
runner and of its batches. Part of batchq-drain, installed beside it.

The timeout is kept here, not by systemd: the unit has TimeoutStartSec=infinity
because systemd re-arms a start timeout from the start of the activation on
every daemon-reload, which would cut a long drain short. A batch that outlives
its timeout gets SIGTERM (its whole process group), and SIGKILL the stop
timeout later, as systemd would do.

Each batch starts in a process group of its own, so that a timeout reaches the
children it forked. Whatever a batch leaves in the unit's cgroup is killed
before the next batch starts: systemd only does that when the whole run ends.
"""

import os
import resource
import select
import signal
import subprocess
import time

# asked: a stop, SIGUSR1 (a hand-over) or SIGTERM; terminated: SIGTERM asked it.
STOP = {"asked": False, "terminated": False}
STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR1}
# The batch that runs; timed_out: its timeout ended it.
BATCH = {"pid": 0, "timed_out": False, "stop_timeout": 0.0}
# The longest the runner waits for what a batch left behind to die.
LEFTOVERS_SECONDS = 2.0


def ask_to_stop(signum, frame):
    STOP["asked"] = True
    if signum == signal.SIGTERM:
        STOP["terminated"] = True


def on_timer(signum, frame):
    """The batch outlived its timeout: SIGTERM, then SIGKILL after the stop timeout (if any)."""
    try:
        if not BATCH["timed_out"]:
            BATCH["timed_out"] = True
            os.killpg(BATCH["pid"], signal.SIGTERM)
            if BATCH["stop_timeout"]:
                signal.setitimer(signal.ITIMER_REAL, BATCH["stop_timeout"])
        else:
            os.killpg(BATCH["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass


class Signals:
    """The signal handlers and masks of the runner and of the batches it forks,
    in one place: every change of a handler or a signal mask is made here.

    The runner handles SIGTERM and SIGUSR1 (a stop) and SIGALRM (a batch's
    timeout) itself. A forked batch gets none of that, but what `python3
    SCRIPT` has after the imports: the handlers of those signals and the mask
    that the preloaded modules left (preloaded()), the default where a handler
    is still the runner's."""

    OWN = (signal.SIGTERM, signal.SIGUSR1, signal.SIGALRM)

    def __init__(self):
        self.runner_mask = None
        self.batch_handlers = {signum: signal.SIG_DFL for signum in self.OWN}
        self.batch_mask = None

    def handle(self, preloading=False):
        """Install the runner's handlers and mask. While it preloads, no batch
        runs: SIGTERM ends it at once. A runner that re-executed itself blocked
        the stop signals until its handlers were back."""
        signal.signal(signal.SIGUSR1, ask_to_stop)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if preloading else ask_to_stop)
        signal.signal(signal.SIGALRM, on_timer)
        if self.runner_mask is None:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            self.runner_mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        else:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.runner_mask)

    def preloaded(self):
        """Record what the preloaded modules left for the batches, then take
        the runner's signals and mask back (a module that blocked SIGTERM must
        not keep the runner from stopping)."""
        for signum in self.OWN:
            handler = signal.getsignal(signum)
            # None: a handler set from C, which Python cannot set again
            self.batch_handlers[signum] = signal.SIG_DFL if handler in (ask_to_stop, on_timer, None) else handler
        self.batch_mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        self.handle()

    def stop_pending(self):
        """Whether a stop was asked, looked at with the stop signals blocked: True
        (and unblocked: their handlers have run), or False with them still blocked,
        so that none is lost before a re-execution (batchq-drain's reexecute())."""
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        if STOP["asked"] or set(signal.sigpending()) & STOP_SIGNALS:
            self.unblock_stops()
            return True
        return False

    @staticmethod
    def unblock_stops():
        """After stop_pending() found none, when no re-execution followed."""
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def fork(self):
        """os.fork(), with none of the runner's signals reaching the child
        before it has set the batch's (batch())."""
        before = signal.pthread_sigmask(signal.SIG_BLOCK, self.OWN)
        try:
            pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
            raise
        if pid:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
        return pid

    def batch(self):
        """In a forked batch: the handlers and the mask the preload left."""
        for signum, handler in self.batch_handlers.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.runner_mask if self.batch_mask is None else self.batch_mask)

    @staticmethod
    def end_by(signum):
        """End the runner by its batch's signal, so that systemd records it (SIGKILL
        has no handler to reset); with no core of the runner: the batch dumped its own."""
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if signum != signal.SIGKILL:
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


SIGNALS = Signals()


def log_identifier(command, number):
    """SYSLOG_IDENTIFIER of a batch's lines: its program's name (a preloaded
    batch's script or module), then the batch."""
    name = command[1] if command[0] == "-m" else os.path.basename(command[0])
    return "%s#%d" % (name, number)


def batch_environment(number):
    env = dict(os.environ, BATCHQ_BATCH=str(number))
    env.pop("NOTIFY_SOCKET", None)  # the runner's alone (NotifyAccess=main)
    return env


class Starter:
    """A way of starting a batch: all that the loop of batches needs of one.
    This base makes no batch ready ahead, and its code never goes stale.
    argv: the command each batch runs."""

    argv = ()

    def start(self, number):
        """Start batch number; returns it (a Popen or a Forked) and its output's read end."""
        raise NotImplementedError

    def ready(self, number, busy_fds):
        """Make batch number ready ahead; busy_fds: the running batch's, which it must not hold."""

    def ready_pids(self):
        """The pids of the batch made ready, which kill_leftovers() spares."""
        return ()

    def discard(self):
        """End the batch made ready, unrun."""

    def stale(self):
        """What changed of the code that the batches start from, or None."""
        return None

    @staticmethod
    def piped(spawn):
        """spawn(into, output) with a new pipe, which the batch writes into and
        the runner reads from output; returns the batch and output."""
        output, into = os.pipe()
        try:
            return spawn(into, output), output
        except OSError:
            os.close(output)
            raise
        finally:
            os.close(into)


class Executed(Starter):
    """Starts each batch as a fresh process running argv."""

    def __init__(self, argv):
        self.argv = argv

    def start(self, number):
        # Its own process group, so that a timeout reaches the children it forked.
        return self.piped(lambda into, _output: subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=into, stderr=into, env=batch_environment(number),
            start_new_session=True))


def run_batch(starter, number, ahead, limits, procs, send):
    """Run batch number to its end, and make the next one ready meanwhile if
    ahead. limits: its timeout and stop timeout in seconds (0: none); procs:
    the unit's cgroup.procs, where its leftovers are found (None: not looked
    for); send(text): one line of its output. Returns its start, its end and
    its return code (negative: the signal that ended it)."""
    started = time.time()
    try:
        child, output = starter.start(number)
    except OSError as exc:
        # What a shell would say and return for a command it cannot run.
        send(("batchq-drain: cannot run %s: %s" % (starter.argv[0], exc.strerror)).encode())
        return started, time.time(), 127 if isinstance(exc, FileNotFoundError) else 126
    timeout, stop_timeout = limits
    BATCH.update(pid=child.pid, timed_out=False, stop_timeout=stop_timeout)
    if timeout:
        signal.setitimer(signal.ITIMER_REAL, timeout)
    times = {}

    def end_leftovers():
        signal.setitimer(signal.ITIMER_REAL, 0)
        times["ended"] = time.time()
        if procs:
            kill_leftovers(procs, starter.ready_pids())

    try:
        if ahead:
            starter.ready(number + 1, [output])
        # SIGALRM handlers run meanwhile
        returncode = relay(child, output, send, end_leftovers)
    finally:
        os.close(output)
    return started, times["ended"], returncode


def own_cgroup_procs():
    """The cgroup.procs file of this service's own cgroup (cgroup v2, hybrid or
    v1), or None when not run by systemd as a service: by hand, the cgroup
    would be a whole session's or container's."""
    with open("/proc/self/cgroup", encoding="utf-8") as handle:
        paths = dict(line.rstrip("\n").split(":", 2)[1:] for line in handle)
    own = paths.get("", paths.get("name=systemd", ""))
    if not os.environ.get("INVOCATION_ID") or not own.endswith(".service"):
        return None
    candidates = []
    if "" in paths:
        candidates += ["/sys/fs/cgroup" + paths[""], "/sys/fs/cgroup/unified" + paths[""]]
    if "name=systemd" in paths:
        candidates.append("/sys/fs/cgroup/systemd" + paths["name=systemd"])
    return next((path + "/cgroup.procs" for path in candidates if os.path.exists(path + "/cgroup.procs")), None)


def kill_leftovers(procs, keep=()):
    """SIGKILL whatever a batch left behind in the unit's cgroup (children it
    forked, daemonized or not), so that the next batch starts with none of it:
    systemd only does this when the whole run ends. keep: the pids of the
    next batch, made ready ahead."""
    spared = {os.getpid(), *keep}
    # Until they are gone, not a number of tries: on a loaded host a killed
    # process may wait a while for a core to exit on.
    deadline = time.monotonic() + LEFTOVERS_SECONDS
    while True:
        try:
            with open(procs, encoding="utf-8") as handle:
                others = [int(pid) for pid in handle.read().split() if int(pid) not in spared]
        except OSError:
            return
        if not others or time.monotonic() > deadline:
            return
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.001)


def child_exited(child):
    """A file descriptor that becomes readable when child exits (Linux 5.3+),
    or None: the relay then looks every 10 ms."""
    try:
        return os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        return None


def relay(child, output, send, end_leftovers):
    """Send the batch's output to the journal line by line until it exits; then
    end what it left behind (which may hold the pipe) and send what is left."""
    exited = child_exited(child)
    poller = select.poll()
    poller.register(output, select.POLLIN)
    if exited is not None:
        poller.register(exited, select.POLLIN)
    pending = [b""]

    def forward(data):
        lines = (pending[0] + data).split(b"\n")
        pending[0] = lines.pop()
        for text in lines:
            send(text)

    try:
        while True:
            events = dict(poller.poll(None if exited is not None else 10))
            if exited in events or (exited is None and child.poll() is not None):
                break
            if output in events:
                data = os.read(output, 65536)
                if not data:
                    break  # the batch closed its output: it exits now
                forward(data)
    finally:
        if exited is not None:
            os.close(exited)
    returncode = child.wait()
    end_leftovers()
    # What the batch wrote just before it ended; a leftover not ended (run by
    # hand, outside a cgroup of its own) may hold the pipe: what it holds now.
    os.set_blocking(output, False)
    for _chunk in range(1024):
        try:
            data = os.read(output, 65536)
        except BlockingIOError:
            break
        if not data:
            break
        forward(data)
    if pending[0]:
        send(pending[0])
    return returncode
