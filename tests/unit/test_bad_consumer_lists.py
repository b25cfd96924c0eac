"""Bad consumers in a whole consumer list, as the role's first task sees it.

These are the cases of molecule/default/tests/test_bad_input.py that need no
host: the role's first task passes consumer_list through the `consumers`
filter, on the controller, before any task reaches a host, so the filter's
error is the play's error. The scenario keeps the cases a host must answer
(accounts, paths, systemd-analyze) and one of these, to prove that the
deploy fails with this message and leaves every host as it was.
"""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.batchq.consumers.plugins.filter.consumers import consumers

# A list shaped like the default scenario's: good consumers beside the bad one.
SCENARIO = [
    {"name": "fresh", "command": "/usr/local/bin/batchq-probe run", "start_delay": "3s"},
    {"name": "serial", "command": "/usr/local/bin/batchq-probe run --sleep 3", "interval": "1s"},
    {"name": "parallel", "command": "/usr/local/bin/batchq-probe run --sleep 2", "instances": 3},
]
GOOD_NEW = {"name": "newcomer", "command": "/usr/local/bin/batchq-probe run"}


def fresh(**fields):
    return dict(SCENARIO[0], **fields)


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
    ("negative time span", fresh(timeout="-5s"), ["'fresh'", "'timeout'", "negative"]),
    ("negative number of seconds", fresh(stop_timeout=-5), ["'fresh'", "'stop_timeout'", "negative"]),
    # systemd reads each as 0: no timeout, a timer that fires at once, a hook after every failure
    ("timeout below a microsecond", fresh(timeout="0.3us"), ["'fresh'", "'timeout'", "microsecond"]),
    ("stop timeout below a microsecond", fresh(stop_timeout="0.0000001"), ["'fresh'", "'stop_timeout'", "microsecond"]),
    ("interval below a microsecond", fresh(interval="0.5us"), ["'fresh'", "'interval'", "microsecond"]),
    ("hook pause below a microsecond", fresh(on_failure_every="0.9usec"),
     ["'fresh'", "'on_failure_every'", "microsecond"]),
    ("infinite start delay", fresh(start_delay="infinity"), ["'fresh'", "'start_delay'"]),
    ("time span beyond systemd's count", fresh(timeout="99999999999999y"), ["'fresh'", "'timeout'", "99999999999999y"]),
    ("time span of many parts beyond systemd's count", fresh(stop_timeout="584542y 1y"), ["'fresh'", "'stop_timeout'"]),
    ("relative command", fresh(command="process_queue --limit 100"), ["'fresh'", "'command'", "absolute"]),
    ("empty command", fresh(command=""), ["'fresh'", "'command'", "empty"]),
    ("unknown key", fresh(intervall="5s"), ["'fresh'", "'intervall'"]),
    ("zero instances", fresh(instances=0), ["'fresh'", "'instances'"]),
    ("memory as prose", fresh(memory_max="lots"), ["'fresh'", "'memory_max'"]),
    ("newline in environment", fresh(environment={"A": "x\ny"}), ["'fresh'", "'environment'", "newline"]),
    ("newline in raw option", fresh(service_options={"Nice": "1\nUser=root"}), ["'fresh'", "'service_options'"]),
    ("root under hardening", fresh(user="root"), ["'fresh'", "'user'", "allow_root"]),
    ("unknown state", fresh(state="stopped"), ["'fresh'", "'state'"]),
] + [("backlog exit code %r" % (value,), fresh(backlog_exit_code=value), ["'fresh'", "'backlog_exit_code'"])
     for value in (0, 256, "more", True, 1.5, 1, 126)]


@pytest.mark.parametrize("bad, words", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_consumer_fails_the_role_naming_consumer_and_field(bad, words):
    bad = bad if isinstance(bad, list) else [bad]
    replaced = {consumer["name"] for consumer in bad}
    kept = [c for c in SCENARIO if c["name"] not in replaced]
    with pytest.raises(AnsibleFilterError) as error:
        consumers(kept + [GOOD_NEW] + bad, {"interval": "1h"}, "batchq-")
    for word in words:
        assert word in str(error.value), "%r not in the error: %s" % (word, error.value)


def test_the_good_list_alone_passes():
    assert [c["name"] for c in consumers(SCENARIO + [GOOD_NEW], {"interval": "1h"}, "batchq-")] == [
        "fresh", "serial", "parallel", "newcomer"]
