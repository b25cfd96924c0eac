"""Bad input fails the play with the consumer and the field named, and no
host changes: not the consumer at fault, and not a good one listed with it."""

import copy

import pytest

from testlib import deploy, host_state, scenario_vars

GOOD_NEW = {"name": "newcomer", "command": "/usr/local/bin/batchq-probe run"}


def fresh(**fields):
    """The 'fresh' consumer of the scenario with some fields changed."""
    consumer = copy.deepcopy(next(c for c in scenario_vars()["consumer_list"] if c["name"] == "fresh"))
    consumer.update(fields)
    return consumer


def named(name, **fields):
    return dict({"command": "/usr/local/bin/batchq-probe run"}, name=name, **fields)


# (case, the bad consumer or consumers, words the error must contain); a bad
# consumer named like one of the scenario's takes its place in the list.
CASES = [
    ("slash in name", named("bad/name"), ["'bad/name'", "'name'"]),
    ("space in name", named("bad name"), ["'bad name'", "'name'"]),
    ("upper case name", named("Thumbs"), ["'Thumbs'", "'name'"]),
    ("name over 48 characters", named("x" * 49), ["'" + "x" * 49 + "'", "'name'"]),
    ("duplicate name", [named("twin"), named("twin")], ["'twin'", "'name'", "more than one"]),
    ("unknown time unit", fresh(interval="1 fortnight"), ["'fresh'", "'interval'", "1 fortnight"]),
    ("negative time span", fresh(timeout="-5s"), ["'fresh'", "'timeout'"]),
    ("infinite start delay", fresh(start_delay="infinity"), ["'fresh'", "'start_delay'"]),
    ("time span beyond systemd's count", fresh(timeout="99999999999999y"), ["'fresh'", "'timeout'", "99999999999999y"]),
    # below the Python check's bound, above systemd's own limit for one part:
    # only systemd-analyze on the host refuses it
    ("time span at systemd's limit", fresh(interval="584542y"), ["'fresh'", "'interval'", "584542y"]),
    ("relative command", fresh(command="process_queue --limit 100"), ["'fresh'", "'command'", "absolute"]),
    ("empty command", fresh(command=""), ["'fresh'", "'command'", "empty"]),
    ("unknown key", fresh(intervall="5s"), ["'fresh'", "'intervall'"]),
    ("zero instances", fresh(instances=0), ["'fresh'", "'instances'"]),
    ("memory as prose", fresh(memory_max="lots"), ["'fresh'", "'memory_max'"]),
    ("newline in environment", fresh(environment={"A": "x\ny"}), ["'fresh'", "'environment'", "newline"]),
    ("newline in raw option", fresh(service_options={"Nice": "1\nUser=root"}), ["'fresh'", "'service_options'"]),
    ("root under hardening", fresh(user="root"), ["'fresh'", "'user'", "allow_root"]),
    ("unknown state", fresh(state="stopped"), ["'fresh'", "'state'"]),
    ("missing account", fresh(user="nobody-here"), ["'fresh'", "'user'", "nobody-here"]),
    ("missing environment file", fresh(environment_file="/etc/batchq/none.env"),
     ["'fresh'", "'environment_file'", "/etc/batchq/none.env"]),
    ("command not on the host", fresh(command="/usr/bin/no-such-consumer"),
     ["'fresh'", "'command'", "/usr/bin/no-such-consumer"]),
    ("command of a drain not on the host", fresh(command="/usr/bin/no-such-consumer", backlog_exit_code=75),
     ["'fresh'", "'command'", "/usr/bin/no-such-consumer"]),
    ("setting systemd does not know", fresh(service_options={"FooBar": "1"}), ["batchq-fresh.service", "FooBar"]),
] + [("backlog exit code %r" % (value,), fresh(backlog_exit_code=value), ["'fresh'", "'backlog_exit_code'"])
     for value in (0, 256, "more", True, 1.5, 1, 126)]


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


@pytest.mark.parametrize("folder", ["var/lib/prometheus/node-exporter", "/var/lib/../tmp", "/var/lib/node exporter"],
                         ids=["relative", "dot-dot", "space"])
def test_bad_metrics_folder_fails_naming_it_and_changes_nothing(hosts, states_before, folder):
    process = deploy(scenario_vars()["consumer_list"] + [GOOD_NEW], consumer_metrics_dir=folder)
    assert process.returncode != 0, process.output
    for word in ("consumer_metrics_dir", folder):
        assert word in process.output, "%r not in the error:\n%s" % (word, process.output[-3000:])
    assert [host_state(host) for host in hosts] == states_before
