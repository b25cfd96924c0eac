"""Makes molecule/testlib.py importable from every scenario's tests, and
sends testinfra's commands through one helper per container (container_shell.py)."""

import time

import pytest

import container_shell
from testlib import FIGURES, PREFIX, WATCHED, all_hosts, release_held, scenario_vars, span_seconds, timers_of

container_shell.install()


@pytest.fixture(scope="module")
def hosts():
    return all_hosts()


@pytest.fixture
def release_held_batch(hosts):
    yield
    release_held(hosts)


@pytest.fixture(autouse=True)
def only_the_watched_consumers_run(request):
    """A run of a test consumer costs the machine about 0.2 CPU-s: its sandbox,
    its Python program and the metrics writer. Ten of them every 2 s on three
    hosts kept the 2 cores busy on their own, and every timing test ran late.
    A test module that names the consumers it WATCHES runs only their timers
    among those that fire during the tests (an interval under a minute); the
    others are stopped, still enabled, so a reboot or a deploy starts them all
    again. Consumers with a longer interval are the tests' to start."""
    watched = getattr(request.module, "WATCHES", None)
    if watched is None:
        return
    enabled = [c for c in scenario_vars()["consumer_list"] if c.get("state", "enabled") == "enabled"]
    unknown = set(watched) - {c["name"] for c in enabled}
    assert not unknown, "WATCHES names consumers the scenario does not run: %s" % sorted(unknown)
    defaults = scenario_vars().get("consumer_defaults", {})
    busy = [c for c in enabled if span_seconds(c.get("interval", defaults.get("interval", "1h"))) < 60]
    resting = [c for c in busy if c["name"] not in watched]
    # A deploy's scheduled start of a timer first, then the timers. A glob
    # names only loaded units, and none is no error. But a starter that
    # elapses as systemctl stops it is unloaded in between ("not loaded"):
    # stopping the starters succeeds when none of them is loaded after.
    starters = " ".join("'%s%s.*start.timer'" % (PREFIX, c["name"]) for c in resting)
    steps = ["{ systemctl stop %s || [ -z \"$(systemctl list-units --all --plain --no-legend %s)\" ]; }"
             % (starters, starters)] if starters else []
    stop = [timer for c in resting for timer in timers_of(c)]
    start = [timer for c in busy if c["name"] in watched for timer in timers_of(c)]
    steps += ["systemctl %s %s" % (verb, " ".join(units)) for verb, units in (("stop", stop), ("start", start)) if units]
    # every test, not once a module: a deploy starts every enabled timer again
    command = " && ".join(steps)
    for host in request.getfixturevalue("hosts") if steps else []:
        # A starter that elapses meanwhile starts its timer, and that start
        # cancels the stop ("Job for batchq-parallel@2.timer canceled."). Or
        # it is unloaded between the glob and the stop, which then stops none
        # of the starters ("Unit batchq-parallel.1.start.timer not loaded.")
        # while the others are still loaded. A starter elapses once: each
        # fails one try at most, and a later try stops what is left for good.
        # Any other failure fails at once.
        done, tries = host.run(command), 1
        while done.rc != 0 and ("canceled" in done.stderr or "not loaded" in done.stderr) and tries < 6:
            done, tries = host.run(command), tries + 1
        assert done.rc == 0, "the timers of the other consumers did not stop on %s: %s" % (
            host.backend.get_hostname(), done.stderr)
    if WATCHED["names"] != sorted(watched):
        WATCHED.update(names=sorted(watched), since=time.time())


def pytest_terminal_summary(terminalreporter):
    """The figures the tests measured, for the README and closing notes."""
    for text in FIGURES:
        terminalreporter.write_line("FIGURE " + text)
