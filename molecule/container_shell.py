"""testinfra's commands to a container, through long-lived helpers: one per
container and thread.

testinfra runs each command as `docker exec NAME /bin/sh -c COMMAND`. Every
`docker exec` costs about 50 ms of CPU (the docker client, the engine, runc),
and the tests run thousands of them: a test that waits on a host asks it
twice a second. Here a small Python helper, started in the container by
`docker exec -i`, runs each command with /bin/sh -c, as docker exec would, and
sends back its exit status, stdout and stderr.

A helper runs one command at a time. Threads that ask the same container at
once (side_by_side) get a helper each. A helper whose container was killed or
restarted has ended; the next command starts a new one. A command that the
container's end cuts short fails with exit status 137. A command that never
reached a helper runs again on a new one, or through docker exec when the
container does not run, which then says why.
"""

import atexit
import struct
import subprocess
import threading

from testinfra.backend.docker import DockerBackend

# Reads commands from stdin: 4 bytes of length, then the command. Says "+"
# once it has read a command, then runs it and writes its exit status, the
# lengths of stdout and stderr, then both. Each command is the leader of a
# session of its own, as under docker exec (runc calls setsid), and gets the
# environment docker exec gave the helper: /proc/self/environ, not os.environ,
# into which Python may have put LC_CTYPE (PEP 538).
HELPER = r"""
import struct, subprocess, sys
read, write = sys.stdin.buffer.read, sys.stdout.buffer
env = dict(item.split(b"=", 1) for item in open("/proc/self/environ", "rb").read().split(b"\0") if b"=" in item)
write.write(b"ready\n")
write.flush()
while True:
    head = read(4)
    if len(head) < 4:
        break
    length = struct.unpack(">I", head)[0]
    command = read(length)
    if len(command) < length:
        break
    write.write(b"+")
    write.flush()
    try:
        done = subprocess.run([b"/bin/sh", b"-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env, start_new_session=True)
        status, out, err = done.returncode if done.returncode >= 0 else 128 - done.returncode, done.stdout, done.stderr
    except (OSError, ValueError) as error:  # a NUL byte in the command, or too long a command
        status, out, err = 126, b"", str(error).encode()
    write.write(struct.pack(">iII", status, len(out), len(err)) + out + err)
    write.flush()
"""

CUT_SHORT = 137  # the exit status of a command cut short by the end of its container
UNSTARTED = "unstarted"  # a command that never reached the helper

_idle = {}  # (container, user): the helpers not running a command
_live = set()  # every helper not yet closed, for the close at exit
_lock = threading.Lock()


class Helper:
    def __init__(self, container, user):
        argv = ["docker", "exec", "-i"] + (["-u", user] if user else []) + [container, "python3", "-c", HELPER]
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL)
        self.ready = self.process.stdout.readline() == b"ready\n"
        if self.ready:
            with _lock:
                _live.add(self)
        else:
            self.close()

    def alive(self):
        return self.process.poll() is None

    def run(self, command):
        """(status, stdout, stderr); UNSTARTED if the helper ended before it
        read the command; None if it ended while the command ran."""
        try:
            self.process.stdin.write(struct.pack(">I", len(command)) + command)
            self.process.stdin.flush()
            if self.process.stdout.read(1) != b"+":
                return UNSTARTED
        except OSError:
            return UNSTARTED
        try:
            status, out_length, err_length = struct.unpack(">iII", self._read(12))
            return status, self._read(out_length), self._read(err_length)
        except (OSError, EOFError):
            return None

    def _read(self, count):
        data = self.process.stdout.read(count) if count else b""
        if len(data) < count:
            raise EOFError
        return data

    def close(self):
        """End the helper (it ends at the end of its stdin) and reap its docker exec."""
        with _lock:
            _live.discard(self)
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _take(key):
    """An idle helper of the container that still runs, or a new one."""
    with _lock:
        idle = _idle.setdefault(key, [])
        helper = idle.pop() if idle else None
    while helper is not None and not helper.alive():
        helper.close()
        with _lock:
            helper = idle.pop() if idle else None
    return helper or Helper(*key)


def run(self, command, *args, **kwargs):
    """DockerBackend.run, through a helper."""
    cmd = self.encode(self.get_command(command, *args))
    key = (self.name, self.user)
    for attempt in (1, 2):  # an idle helper may have ended with its container a moment ago
        helper = _take(key)
        if not helper.ready:
            break
        answer = helper.run(cmd)
        if answer == UNSTARTED:  # no harm done: the next attempt runs it on a new helper
            helper.close()
            continue
        if answer is None:
            helper.close()
            return self.result(CUT_SHORT, cmd, b"", b"the container ended during the command")
        with _lock:
            _idle[key].append(helper)
        return self.result(answer[0], cmd, answer[1], answer[2])
    # The container does not run (or has no python3): docker exec says why.
    return _docker_exec(self, command, *args, **kwargs)


_docker_exec = DockerBackend.run


def install():
    """Send every command of testinfra's docker backend through the helpers."""
    DockerBackend.run = run


@atexit.register
def _close_all():
    for helper in list(_live):
        helper.close()
