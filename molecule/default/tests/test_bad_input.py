"""Bad input fails the play with the consumer and the field named, and no
host changes: not the consumer at fault, and not a good one listed with it."""

import copy

import pytest

from testlib import deploy, host_state, scenario_vars, systemd_version

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()

GOOD_NEW = {"name": "newcomer", "command": "/usr/local/bin/batchq-probe run"}


def fresh(**fields):
    """The 'fresh' consumer of the scenario with some fields changed."""
    consumer = copy.deepcopy(next(c for c in scenario_vars()["consumer_list"] if c["name"] == "fresh"))
    consumer.update(fields)
    return consumer


# (case, the bad consumer or consumers, words the error must contain); a bad
# consumer named like one of the scenario's takes its place in the list.
# Bad input the controller refuses alone is tested, case by case, by
# tests/unit/test_bad_consumer_lists.py on the filter the role calls first,
# and what the planner makes of each host answer (a missing path, account or
# metrics folder) by tests/unit/test_consumer_plan.py. "unknown key" and
# "missing account" prove here that the deploy fails with that message and
# changes no host; the others need the host's systemd to refuse them.
CASES = [
    ("unknown key", fresh(intervall="5s"), ["'fresh'", "'intervall'"]),
    ("credential name", fresh(credentials={"db/password": "s3cret"}), ["'fresh'", "'credentials'", "db/password"]),
    ("credential value not a string", fresh(hook_credentials={"pin": 1234}, on_failure="/usr/local/bin/batchq-hook-record"),
     ["'fresh'", "'hook_credentials'", "value of pin must be a string"]),
    # below the Python check's bound, above systemd's own limit for one part:
    # only systemd-analyze on the host refuses it
    ("time span at systemd's limit", fresh(interval="584542y"), ["'fresh'", "'interval'", "584542y"]),
    ("missing account", fresh(user="nobody-here"), ["'fresh'", "'user'", "nobody-here"]),
    ("setting systemd does not know", fresh(service_options={"FooBar": "1"}), ["batchq-fresh.service", "FooBar"]),
]


@pytest.fixture(scope="module")
def states_before(hosts):
    return [host_state(host) for host in hosts]


@pytest.mark.parametrize("bad, words", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_consumer_fails_naming_it_and_changes_nothing(hosts, states_before, bad, words):
    bad = bad if isinstance(bad, list) else [bad]
    replaced = {consumer["name"] for consumer in bad}
    kept = [c for c in scenario_vars()["consumer_list"] if c["name"] not in replaced]
    process = deploy(kept + [GOOD_NEW] + bad)
    assert process.returncode != 0, process.output
    for word in words:
        assert word in process.output, "%r not in the error:\n%s" % (word, process.output[-3000:])
    assert [host_state(host) for host in hosts] == states_before


def test_credentials_a_run_could_not_read_fail_naming_consumer_field_and_fix(hosts, states_before):
    # A private /run, as docker and podman give a systemd container: systemd
    # 257 and older mount a run's credentials where no unit sees them, root's
    # too. The first host (Debian 11) is enough for the whole deploy to stop
    # before any host changes.
    private = hosts[0]
    name = private.backend.get_hostname()
    sealed = fresh(name="sealed", credentials={"db_password": "s3cret"})
    as_root = fresh(name="as-root", credentials={"db_password": "s3cret"}, user="root", allow_root=True)
    hooked = fresh(name="hooked", on_failure="/usr/local/bin/batchq-hook-record",
                   hook_credentials={"webhook_token": "s3cret"})
    private.check_output("mount --make-private /run")
    try:
        process = deploy(scenario_vars()["consumer_list"] + [sealed, as_root, hooked])
    finally:
        private.check_output("mount --make-shared /run")
    assert process.returncode != 0, process.output
    for consumer, field in (("sealed", "credentials"), ("as-root", "credentials"), ("hooked", "hook_credentials")):
        problem = ("consumer '%s': field '%s': /run is a private mount on %s (as in a docker or podman container),"
                   " and systemd %d cannot pass credentials to a unit through it. Make /run shared at every boot"
                   " (mount --make-shared /run" % (consumer, field, name, systemd_version(private)))
        assert problem in process.output, process.output[-3000:]
    # the other hosts share /run: nothing to say of them
    assert all("on %s (" % host.backend.get_hostname() not in process.output for host in hosts[1:]), process.output
    assert [host_state(host) for host in hosts] == states_before
