"""The reference PostgreSQL consumer against a real server, without systemd.

One container runs Debian 12's PostgreSQL (the image `make images` builds for
the fleet scenario) in the foreground; two client containers run the
example's programs as a worker would: Debian 11 with psycopg2, Debian 13 with
psycopg 3. The containers are named BATCHQ_HOST_PREFIX-pgqueue-* (as the
molecule hosts are) and removed at the end, whatever the outcome.
"""

import contextlib
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The queue library's property model (test_property.py), shared with tests/queues.
QUEUE_TESTS = ROOT / "tests" / "queues"
# The tests' one wait; benchmarks/queues.py loads this file by its path, so the paths are set here.
sys.path += [str(ROOT / "tests" / "unit"), str(QUEUE_TESTS)]
import drain_runner  # noqa: E402  # pylint: disable=wrong-import-position
from waiting import wait_for  # noqa: E402  # pylint: disable=wrong-import-position
EXAMPLE = ROOT / "examples" / "postgresql_queue"
LIBRARY = ROOT / "examples" / "queue_library"
LIBRARY_DIR = "/usr/local/lib/batchq-queue"
PREFIX = os.environ.get("BATCHQ_HOST_PREFIX", "batchq") + "-pgqueue"
NETWORK = PREFIX
DATABASE = PREFIX + "-postgresql"
CLIENTS = {"psycopg2": (PREFIX + "-debian11", "batchq/debian:bullseye"),
           "psycopg3": (PREFIX + "-debian13", "batchq/debian:trixie")}
PASSWORD = "pgqueue test 'secret' $1"
# What a worker's consumer gets from its unit (group_vars/consumers.yml).
ENVIRONMENT = {"PGHOST": DATABASE, "PGDATABASE": "batchq", "PGUSER": "batchq", "PGPASSWORD": PASSWORD}

# Debian's cluster as database.yml creates it (the image has no locale, as a
# minimal host has none), run by postgres in the foreground (no systemd
# here), with database.yml's network access for the queue's role.
SERVER = r"""set -eu
v=$(ls /usr/lib/postgresql)
[ -d /etc/postgresql/$v/main ] || pg_createcluster $v main >/dev/null
echo 'host batchq batchq all scram-sha-256' >>/etc/postgresql/$v/main/pg_hba.conf
install -d -o postgres -g postgres /run/postgresql
exec runuser -u postgres -- /usr/lib/postgresql/$v/bin/postgres -D /var/lib/postgresql/$v/main \
  -c config_file=/etc/postgresql/$v/main/postgresql.conf -c listen_addresses='*'
"""


def database_setup():
    """The psql script of database.yml's task that creates the role and the database."""
    play = yaml.safe_load((EXAMPLE / "database.yml").read_text())[0]
    task = next(t for t in play["tasks"] if t["name"] == "Create the role and the database")
    return task["ansible.builtin.command"]["stdin"]


def docker(*argv, check=True, timeout=120, **kwargs):
    return subprocess.run(["docker", *argv], check=check, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, **kwargs)


def sql(query):
    """One query as postgres on the server; its rows as text (psql -At)."""
    return docker("exec", DATABASE, "runuser", "-u", "postgres", "--", "psql", "-d", "batchq", "-AtX",
                  "-v", "ON_ERROR_STOP=1", "-c", query).stdout.strip()


def states(queue):
    rows = sql("SELECT state, count(*) FROM batchq_jobs WHERE queue = '%s' GROUP BY state" % queue)
    return {state: int(count) for state, count in (line.split("|") for line in rows.splitlines())}


def remove():
    docker("rm", "--force", DATABASE, *(name for name, _image in CLIENTS.values()), check=False)
    docker("network", "rm", NETWORK, check=False)


class Client:
    """A worker: the example's programs in a container, run as its unit would."""

    def __init__(self, driver):
        self.driver = driver
        self.name = CLIENTS[driver][0]

    def argv(self, program, args, env, state):
        environment = dict(ENVIRONMENT, **env)
        if state:
            environment["STATE_DIRECTORY"] = state
        return ["exec", *("-e%s=%s" % item for item in sorted(environment.items())), self.name,
                program, *args]

    def run(self, program, *args, env=None, state=None, timeout=120):
        """A program of the example to its end: (exit status, output)."""
        done = docker(*self.argv("/usr/local/bin/" + program, args, env or {}, state), check=False, timeout=timeout)
        return done.returncode, done.stdout

    def start(self, argv, pidfile, env=None, state=None):
        """argv in the background, its pid written to pidfile first: the Popen of the docker exec."""
        shell = ["/bin/sh", "-c", 'echo $$ >"$0" && exec "$@"', pidfile, *argv]
        command = ["docker", *self.argv(shell[0], shell[1:], env or {}, state)]
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def shell(self, script):
        return docker("exec", self.name, "/bin/sh", "-c", script).stdout

    def records(self, state):
        """The consumer's own records in state, oldest first (batches.jsonl.1, then batches.jsonl)."""
        text = self.shell("cat %s/batches.jsonl.1 %s/batches.jsonl 2>/dev/null || true" % (state, state))
        return [json.loads(line) for line in text.splitlines()]


@contextlib.contextmanager
def pgqueue_fleet():
    """The server and the clients, removed at the end whatever happened (benchmarks/queues.py uses it too)."""
    remove()
    try:
        docker("network", "create", NETWORK)
        docker("run", "--detach", "--name", DATABASE, "--network", NETWORK, "batchq/postgresql:bookworm",
               "/bin/sh", "-c", SERVER)
        wait_for(lambda: docker("exec", DATABASE, "pg_isready", "-q", check=False).returncode == 0, 60,
                 "PostgreSQL to accept connections", interval=0.2)
        docker("exec", "-e", "PGQUEUE_PASSWORD=" + PASSWORD, "-i", DATABASE, "runuser", "-u", "postgres", "--",
               "psql", "-v", "ON_ERROR_STOP=1", "-v", "role=batchq", "-v", "database=batchq", input=database_setup())
        # As database.yml applies it: as the queue's role.
        docker("exec", "-i", DATABASE, "runuser", "-u", "postgres", "--", "psql", "-d", "batchq",
               "-v", "ON_ERROR_STOP=1", "-c", "SET ROLE batchq", "-f", "-",
               input=(EXAMPLE / "schema.sql").read_text())
        for name, image in CLIENTS.values():
            docker("run", "--detach", "--name", name, "--network", NETWORK, image, "sleep", "infinity")
            for program in ("batchq-pgqueue", "batchq-pgqueue-enqueue"):
                docker("cp", str(EXAMPLE / program), "%s:/usr/local/bin/%s" % (name, program))
            # where deploy.yml (and the playbook batchq.consumers.queue_library) put the modules the consumer imports
            docker("exec", name, "mkdir", "-p", LIBRARY_DIR)
            for module in (LIBRARY / "batchq_queue.py", EXAMPLE / "batchq_pgqueue.py"):
                docker("cp", str(module), "%s:%s/%s" % (name, LIBRARY_DIR, module.name))
            # the runner and the modules it imports from its own folder (consumer_protocol.py is a link)
            for path in [drain_runner.RUNNER] + drain_runner.MODULES:
                docker("cp", str(path.resolve()), "%s:/usr/local/bin/%s" % (name, path.name))
        yield
    finally:
        remove()


@pytest.fixture(scope="session")
def server():
    with pgqueue_fleet():
        yield


def pytest_generate_tests(metafunc):
    """Each test under both drivers; one marked `one_driver` (what it checks is the
    server's or the consumer's own logic, never the driver's) under psycopg 3 alone."""
    if "client" in metafunc.fixturenames:
        drivers = ["psycopg3"] if metafunc.definition.get_closest_marker("one_driver") else sorted(CLIENTS)
        metafunc.parametrize("client", drivers, indirect=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "one_driver: the test checks no driver's code, and runs under psycopg 3 alone")


@pytest.fixture
def client(request, server):
    return Client(request.param)


@pytest.fixture
def queue(request, client):
    """A queue (and a state folder for the records) of this test's own."""
    # the test's name, cut, and a digest of its whole name with its parameters
    digest = hashlib.sha1(request.node.name.encode()).hexdigest()[:6]
    name = "%s-%s-%s" % (request.node.originalname.replace("_", "-")[5:40], digest, client.driver)
    client.shell("rm -rf /tmp/%s && mkdir -p /tmp/%s" % (name, name))
    return name
