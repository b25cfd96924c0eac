"""Dropping secret_environment from a consumer that runs every second: no run
fails for want of the file while its unit still names it."""

import json
import time

from testlib import PREFIX, assert_deployed, consumers, deploy, finished, journal, runs, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()

NAME = "secretive"
SECRET_FILE = "/etc/batchq/%s.env" % NAME
# systemd's catalog id of "unit failed" (catalog/systemd.catalog.in)
UNIT_FAILED = "d9b373ed55a64feb8242e02dbe79a49c"


def secretive(**fields):
    # about a start a second, so that any moment of a deploy without the file
    # while the unit still names it sees a start (each run costs 0.2 CPU-s:
    # five a second on four hosts kept the 2 cores busy and slowed the deploys)
    return dict({"name": NAME, "command": "/usr/local/bin/batchq-probe run", "interval": "500ms",
                 "accuracy": "50ms", "start_delay": "1s"}, **fields)


def failures(host, since):
    """The manager's messages about failed runs of the consumer since then."""
    out = host.check_output("journalctl --no-pager -o json --since=@%s -u %s", str(int(since)), PREFIX + NAME + ".service")
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [e.get("MESSAGE") for e in entries
            if e.get("MESSAGE_ID") == UNIT_FAILED or "Failed to load environment files" in str(e.get("MESSAGE"))]


def test_dropping_secrets_from_a_running_consumer_fails_no_run(hosts):
    try:
        assert_deployed(deploy(consumers() + [secretive(secret_environment={"TOKEN": "hunter2"})]))
        for host in hosts:
            assert host.file(SECRET_FILE).exists
            wait_for(lambda: len(finished(runs(host, NAME))) >= 2, 30, "two runs of %s" % NAME)
        since = time.time() - 1
        before = {host.backend.get_hostname(): len(runs(host, NAME)) for host in hosts}

        assert_deployed(deploy(consumers() + [secretive()]))
        for host in hosts:
            assert not host.file(SECRET_FILE).exists, "the secret file was kept"
            # the deploy took seconds: batches started while it ran
            assert len(runs(host, NAME)) > before[host.backend.get_hostname()] + 1, journal(host, NAME)
            assert failures(host, since) == [], journal(host, NAME)
    finally:
        assert_deployed(deploy(consumers() + [{"name": NAME, "state": "absent"}]))
        for host in hosts:
            host.run("rmdir /etc/batchq")
