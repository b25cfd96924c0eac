"""testinfra's commands to a container, through one long-lived helper each.

testinfra runs each command as `docker exec NAME /bin/sh -c COMMAND`. Every
`docker exec` costs about 50 ms of CPU (the docker client, the engine, runc),
and the tests run thousands of them: a test that waits on a host asks it
twice a second. Here a small Python helper, started once in the container by
`docker exec -i`, runs each command with /bin/sh -c, as docker exec would, and
sends back its exit status, stdout and stderr. The tests see the same results.

A helper runs one command at a time. Threads that ask the same container at
once (side_by_side) get a helper each. A helper whose container was killed or
restarted has ended; the next command starts a new one. A command that the
container's end cuts short fails with exit status 137, as under docker exec.
"""

import atexit
import struct
import subprocess
import threading

from testinfra.backend.docker import DockerBackend

# Reads commands from stdin: 4 bytes of length, then the command. Writes its
# exit status, the lengths of stdout and stderr, then both. The commands get
# the environment docker exec gave the helper: /proc/self/environ, not
# os.environ, into which Python may have put LC_CTYPE (PEP 538).
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
    command = read(struct.unpack(">I", head)[0])
    done = subprocess.run([b"/bin/sh", b"-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env)
    status = done.returncode if done.returncode >= 0 else 128 - done.returncode
    write.write(struct.pack(">iII", status, len(done.stdout), len(done.stderr)) + done.stdout + done.stderr)
    write.flush()
"""

# A command cut short by the end of its container (docker exec says 137 too).
CUT_SHORT = 137

_idle = {}  # (container, user): helpers not running a command
_lock = threading.Lock()
_started = []


class Helper:
    def __init__(self, container, user):
        argv = ["docker", "exec", "-i"] + (["-u", user] if user else []) + [container, "python3", "-c", HELPER]
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL)
        self.ready = self.process.stdout.readline() == b"ready\n"
        _started.append(self)

    def alive(self):
        return self.ready and self.process.poll() is None

    def run(self, command):
        """(status, stdout, stderr), or None if the helper ended before it answered."""
        try:
            self.process.stdin.write(struct.pack(">I", len(command)) + command)
            self.process.stdin.flush()
            head = self._read(12)
            status, out_length, err_length = struct.unpack(">iII", head)
            return status, self._read(out_length), self._read(err_length)
        except (BrokenPipeError, EOFError, struct.error):
            return None

    def _read(self, count):
        data = self.process.stdout.read(count) if count else b""
        if len(data) < count:
            raise EOFError
        return data

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait()


def _take(key):
    with _lock:
        idle = _idle.setdefault(key, [])
        while idle:
            helper = idle.pop()
            if helper.alive():
                return helper
    return Helper(*key)


def _give_back(key, helper):
    with _lock:
        _idle[key].append(helper)


def run(self, command, *args, **kwargs):
    """DockerBackend.run, through a helper."""
    cmd = self.get_command(command, *args)
    key = (self.name, self.user)
    helper = _take(key)
    if not helper.ready:
        # The container does not run (or has no python3): docker exec says why.
        return _docker_exec(self, command, *args, **kwargs)
    answer = helper.run(self.encode(cmd))
    if answer is None:
        out = self.result(CUT_SHORT, self.encode(cmd), b"", b"the container ended during the command")
    else:
        _give_back(key, helper)
        out = self.result(answer[0], self.encode(cmd), answer[1], answer[2])
    return out


_docker_exec = DockerBackend.run


def install():
    """Send every command of testinfra's docker backend through the helpers."""
    DockerBackend.run = run


@atexit.register
def _close_all():
    for helper in _started:
        helper.close()
