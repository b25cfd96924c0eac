"""Drains each reference queue with jobs of 1 ms: the library's worker process
against the same work in the batch's own process.

Usage: make queues images && .cache/queues-venv/bin/python benchmarks/queues.py \\
           [--jobs N] [--rounds R] [--work-ms MS] [--loop] [--commit-delay S] [BACKEND ...]
BACKEND: spool, sqs, postgresql (default: all three). Defaults: 2000 jobs,
3 rounds, 1 ms of work a job (the stand-in's sleep). About 4 minutes on 2 cores.

Each round fills the queue with N jobs and drains it twice, once in each mode,
the modes in turn so that both share the machine's moods:
  worker  the reference program as shipped (batchq-spool, batchq-sqs,
          batchq-pgqueue): a batch runs its jobs in one worker process;
  inline  the same program through benchmarks/queue_inline.py, which calls
          process(job) in the batch's own process: the same work, no worker.
A drain runs the program with --limit 100 while it exits the backlog code (75),
a new process a batch, as a consumer with backlog_exit_code does, until it
exits 0; then it checks that every job was done. The spool works in a
temporary folder, SQS on a moto server on 127.0.0.1, PostgreSQL in the
containers of tests/pgqueue (Debian 12's server, a Debian 13 client with
psycopg 3), where the drain's loop runs inside the client.
With --loop (PostgreSQL only), a drain is one `batchq-pgqueue --loop` process,
batch after batch on one connection: no batch pays a new process, its imports
and a connection, and what is left is what each job costs. --commit-delay
(PostgreSQL only) is passed on to batchq-pgqueue (its default: 0.05 s).
Prints one line a backend and mode (the median of the rounds' seconds, and
jobs/s), then the worker's jobs/s as a share of the inline one's. For
PostgreSQL, also the CPU each job cost the client's container (the batches,
their workers, the drain's loop) and the server's, from their cgroups (the
median of the rounds).
"""

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(TOP, "examples")
INLINE = os.path.join(TOP, "benchmarks", "queue_inline.py")
PYTHON = sys.executable
BACKLOG = 75


def container_cpu(name):
    """The CPU time (ns) the container name has used, from its cgroup: v1 (cgroupfs) or v2 (systemd's
    scopes); None where neither is found."""
    ident = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", name], check=True, stdout=subprocess.PIPE,
                           text=True).stdout.strip()
    try:
        with open("/sys/fs/cgroup/cpuacct/docker/%s/cpuacct.usage" % ident, encoding="ascii") as usage:
            return int(usage.read())
    except FileNotFoundError:
        pass
    try:
        with open("/sys/fs/cgroup/system.slice/docker-%s.scope/cpu.stat" % ident, encoding="ascii") as stat:
            return next(int(line.split()[1]) * 1000 for line in stat if line.startswith("usage_usec "))
    except FileNotFoundError:
        return None


def drain(argv, inline):
    """Runs argv (a reference consumer) while it exits BACKLOG: the seconds it took."""
    command = [PYTHON, INLINE, *argv] if inline else [PYTHON, *argv]
    started = time.monotonic()
    while True:
        code = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
        if code.returncode != BACKLOG:
            break
    if code.returncode != 0:
        sys.exit("queues.py: %s exited %d:\n%s" % (argv[0], code.returncode, code.stderr[-2000:]))
    return time.monotonic() - started


class Spool:
    name = "spool"

    def __init__(self, work, jobs, work_ms):
        self.spool = os.path.join(work, "spool")
        self.jobs = jobs
        self.work_ms = work_ms
        os.environ["STATE_DIRECTORY"] = os.path.join(work, "state")
        os.makedirs(os.environ["STATE_DIRECTORY"])
        self.round = 0

    def fill(self):
        self.round += 1
        program = os.path.join(EXAMPLES, "spool_queue", "batchq-spool-enqueue")
        subprocess.run([PYTHON, program, str(self.jobs), "--spool", self.spool, "--prefix", "r%d" % self.round],
                       check=True, stdout=subprocess.DEVNULL)

    def drain(self, inline):
        program = os.path.join(EXAMPLES, "spool_queue", "batchq-spool")
        seconds = drain([program, "--spool", self.spool, "--limit", "100", "--work-ms", str(self.work_ms)], inline)
        left = os.listdir(os.path.join(self.spool, "incoming"))
        if left:
            sys.exit("queues.py: the spool's drain left %d files in incoming/" % len(left))
        return seconds

    def close(self):
        pass


class SQS:
    name = "sqs"

    def __init__(self, work, jobs, work_ms):
        self.work = work
        self.jobs = jobs
        self.work_ms = work_ms
        for name in [name for name in os.environ if name.startswith("AWS_")]:
            del os.environ[name]  # no real credentials, no instance metadata
        os.environ.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                          AWS_EC2_METADATA_DISABLED="true", CREDENTIALS_DIRECTORY=os.path.join(work, "credentials"))
        os.makedirs(os.environ["CREDENTIALS_DIRECTORY"])
        with open(os.path.join(os.environ["CREDENTIALS_DIRECTORY"], "aws"), "w", encoding="ascii") as out:
            out.write("[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
        self.log = open(os.path.join(work, "moto.log"), "w", encoding="utf-8")
        import socket  # pylint: disable=import-outside-toplevel
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.endpoint = "http://127.0.0.1:%d" % port
        self.server = subprocess.Popen([os.path.join(os.path.dirname(PYTHON), "moto_server"), "-H", "127.0.0.1",
                                        "-p", str(port)], stdout=self.log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.server.poll() is not None:
                    sys.exit("queues.py: moto_server did not answer on %s" % self.endpoint)
                time.sleep(0.1)
        import boto3  # pylint: disable=import-outside-toplevel
        self.sqs = boto3.client("sqs", endpoint_url=self.endpoint, region_name="us-east-1",
                                aws_access_key_id="testing", aws_secret_access_key="testing")
        self.round = 0
        self.url = None

    def fill(self):
        self.round += 1
        dead = self.sqs.create_queue(QueueName="jobs-%d-dlq" % self.round)["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "5"})
        self.url = self.sqs.create_queue(QueueName="jobs-%d" % self.round,
                                         Attributes={"RedrivePolicy": policy})["QueueUrl"]
        program = os.path.join(EXAMPLES, "sqs_queue", "batchq-sqs-enqueue")
        subprocess.run([PYTHON, program, str(self.jobs), "--queue-url", self.url, "--endpoint-url", self.endpoint,
                        "--region", "us-east-1"], check=True, stdout=subprocess.DEVNULL)

    def drain(self, inline):
        program = os.path.join(EXAMPLES, "sqs_queue", "batchq-sqs")
        results = os.path.join(self.work, "results-%d-%s" % (self.round, inline))
        seconds = drain([program, "--queue-url", self.url, "--endpoint-url", self.endpoint, "--region", "us-east-1",
                         "--results", results, "--limit", "100", "--work-ms", str(self.work_ms),
                         "--max-attempts", "3", "--wait-seconds", "1"], inline)
        written = len([name for name in os.listdir(results) if name.endswith(".json")])  # not .by-day/'s links
        if written != self.jobs:
            sys.exit("queues.py: the SQS drain wrote %d results for %d jobs" % (written, self.jobs))
        return seconds

    def close(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.server.pid, signal.SIGKILL)
        self.server.wait()
        self.log.close()


class PostgreSQL:
    """The server and a psycopg 3 client of tests/pgqueue/conftest.py, in containers."""
    name = "postgresql"

    def __init__(self, _work, jobs, work_ms, options=()):
        spec = importlib.util.spec_from_file_location("pgqueue", os.path.join(TOP, "tests", "pgqueue", "conftest.py"))
        self.pg = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.pg)
        self.jobs = jobs
        self.work_ms = work_ms
        self.options = list(options)  # batchq-pgqueue's own: --loop, --commit-delay
        self.fleet = self.pg.pgqueue_fleet()
        self.fleet.__enter__()  # pylint: disable=unnecessary-dunder-call  # closed in close()
        self.client = self.pg.Client("psycopg3")
        self.pg.docker("cp", INLINE, "%s:/usr/local/bin/queue_inline.py" % self.client.name)
        self.round = 0
        # per mode, each round's CPU a job in microseconds: (the client's container, the server's)
        self.cpu = {False: [], True: []}

    def fill(self):
        self.round += 1
        code, output = self.client.run("batchq-pgqueue-enqueue", str(self.jobs), "--queue", "r%d" % self.round)
        if code:
            sys.exit("queues.py: batchq-pgqueue-enqueue exited %d: %s" % (code, output))

    def drain(self, inline):
        program = "/usr/local/bin/batchq-pgqueue"
        argv = ["/usr/local/bin/queue_inline.py", program] if inline else [program]
        loop = 'while :; do "$@" >/dev/null 2>/tmp/drain.err; c=$?; [ $c = %d ] || break; done; ' \
               '[ $c = 0 ] || { tail -5 /tmp/drain.err; exit $c; }' % BACKLOG
        containers = (self.client.name, self.pg.DATABASE)
        before = [container_cpu(name) for name in containers]
        started = time.monotonic()
        shell = ["-c", loop, "drain", "python3", *argv, "--queue", "r%d" % self.round, "--limit", "100",
                 "--work-ms", str(self.work_ms), *self.options]
        done = self.pg.docker(*self.client.argv("/bin/sh", shell, {}, "/tmp"), check=False, timeout=600)
        seconds = time.monotonic() - started
        after = [container_cpu(name) for name in containers]
        if None not in before + after:
            self.cpu[inline].append(tuple((end - begin) / 1000.0 / self.jobs for begin, end in zip(before, after)))
        if done.returncode:
            sys.exit("queues.py: the PostgreSQL drain exited %d: %s" % (done.returncode, done.stdout))
        states = self.pg.states("r%d" % self.round)
        if states != {"done": self.jobs}:
            sys.exit("queues.py: the PostgreSQL drain left %s" % states)
        return seconds

    def close(self):
        self.fleet.__exit__(None, None, None)


BACKENDS = {backend.name: backend for backend in (Spool, SQS, PostgreSQL)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--loop", action="store_true", help="PostgreSQL only: one batchq-pgqueue --loop a drain")
    parser.add_argument("--commit-delay", help="PostgreSQL only: batchq-pgqueue's --commit-delay")
    parser.add_argument("backends", nargs="*", metavar="BACKEND", help="spool, sqs or postgresql (default: all)")
    args = parser.parse_args()
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        parser.error("no such backend: %s" % ", ".join(sorted(unknown)))
    args.backends = args.backends or sorted(BACKENDS)
    options = (["--loop"] if args.loop else []) + (["--commit-delay", args.commit_delay] if args.commit_delay else [])
    if options and args.backends != ["postgresql"]:
        parser.error("--loop, --commit-delay: PostgreSQL only (give the backend postgresql)")
    print("jobs %d, %g ms of work each, %d rounds, --limit 100 %s" % (args.jobs, args.work_ms, args.rounds,
                                                                      " ".join(options)))
    for name in args.backends:
        work = tempfile.mkdtemp(prefix="batchq-queues-")
        backend = None
        try:
            backend = BACKENDS[name](work, args.jobs, args.work_ms, **({"options": options} if options else {}))
            seconds = {False: [], True: []}
            for number in range(args.rounds):
                for inline in ((False, True) if number % 2 == 0 else (True, False)):
                    backend.fill()
                    seconds[inline].append(backend.drain(inline))
            rates = {}
            for inline, label in ((False, "worker"), (True, "inline")):
                median = statistics.median(seconds[inline])
                rates[inline] = args.jobs / median
                print("%-10s %-6s %7.2f s  %7.1f jobs/s  (rounds: %s)" % (
                    name, label, median, rates[inline], ", ".join("%.2f" % s for s in seconds[inline])))
            print("%-10s worker/inline %.3f" % (name, rates[False] / rates[True]))
            for inline, label in ((False, "worker"), (True, "inline")):
                rounds = getattr(backend, "cpu", {}).get(inline)
                if rounds:
                    print("%-10s %-6s CPU a job: client %.0f us, server %.0f us" % (
                        name, label, statistics.median(c for c, _s in rounds), statistics.median(s for _c, s in rounds)))
        finally:
            if backend is not None:
                backend.close()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
