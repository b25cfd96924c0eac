"""The failure hooks' rate limit and names, pure parts of batchq_after_run.py."""

import importlib.util
import json
import os

import pytest

from ansible_collections.batchq.consumers.plugins.module_utils import consumer_names, consumer_runtime, consumer_spec

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "consumer", "files", "batchq_after_run.py")
SPEC = importlib.util.spec_from_file_location("batchq_after_run", SCRIPT)
after_run = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(after_run)

EVERY = 900.0


def storm(outcomes, every=EVERY):
    """(time, failed) runs, or (time, failed, unit) runs of instances, from an
    empty state: the hooks they start, as (time, kind, failures)."""
    state, started = {}, []
    for now, failed, *unit in outcomes:
        state, hook = after_run.hook_decision(state, (unit or ["batchq-x.service"])[0], failed, now, every)
        if hook:
            started.append((now, hook[0], hook[1]))
    return started


def test_a_crash_storm_notifies_once_per_period_counting_every_failure():
    # a failure every 10 s for an hour, from t=0 to t=3590
    started = storm((t, True) for t in range(0, 3600, 10))
    assert [(when, kind) for when, kind, count in started] == [
        (0, "on_failure"), (900, "on_failure"), (1800, "on_failure"), (2700, "on_failure")]
    assert [count for when, kind, count in started] == [1, 90, 90, 90]


def test_the_first_failure_after_a_success_notifies_at_once_and_recovery_counts_the_episode():
    started = storm([(0, True), (10, True), (20, False), (30, True), (40, True), (50, True), (60, False), (70, False)])
    assert started == [(0, "on_failure", 1), (20, "on_recovery", 2), (30, "on_failure", 1), (60, "on_recovery", 3)]


def test_a_poison_job_that_crashes_each_instance_in_turn_is_one_episode():
    # 10 crashes in 10 min, each of two instances by turns, the other one
    # succeeding in between: before, 20 notifications for 10 crashes
    runs = []
    for minute in range(10):
        crashed, other = ("batchq-x@1.service", "batchq-x@2.service")[::1 if minute % 2 else -1]
        runs += [(minute * 60, True, crashed), (minute * 60 + 30, False, other)]
    started = storm(runs)
    assert started == [(0, "on_failure", 1)]
    # healthy again when the last run of each instance has succeeded
    assert storm(runs + [(600, False, "batchq-x@1.service"), (601, False, "batchq-x@2.service")])[-1] == (
        600, "on_recovery", 10)


def test_an_instance_that_goes_on_failing_keeps_the_episode_open():
    started = storm([(0, True, "batchq-x@1.service"), (10, False, "batchq-x@2.service"),
                     (20, True, "batchq-x@1.service"), (30, False, "batchq-x@2.service"),
                     (40, False, "batchq-x@1.service")])
    assert started == [(0, "on_failure", 1), (40, "on_recovery", 2)]


def test_successes_alone_start_nothing():
    assert storm([(0, False), (10, False)]) == []


def test_every_zero_notifies_each_failure():
    assert storm([(0, True), (1, True), (2, True)], every=0) == [
        (0, "on_failure", 1), (1, "on_failure", 1), (2, "on_failure", 1)]


def test_hook_units_are_never_taken_for_a_consumer_unit():
    unit_re = consumer_names.unit_re()
    for unit, expected in (("batchq-mail.service", "batchq-mail.on-failure.abc.service"),
                           ("batchq-mail@2.service", "batchq-mail.2.on-recovery.abc.service")):
        kind = "on_recovery" if "@" in unit else "on_failure"
        name = after_run.hook_unit(unit, kind, "abc")
        assert name == expected
        assert not unit_re.match(name)


def test_the_script_and_the_collection_agree_on_names():
    assert after_run.STATE_DIR == consumer_names.HOOKS_STATE_DIR
    assert os.path.basename(consumer_names.AFTER_RUN) == os.path.basename(SCRIPT)


def test_a_drains_failed_batch_log_is_its_last_batch_relayed_by_its_runner():
    runner = "{ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -I /usr/local/lib/batchq/batchq-drain 75 ... }"
    assert after_run.batch_matches(runner, "4242", "batch 12 ended: exit-code 1 after 0.100s") == [
        "_PID=4242", "BATCHQ_BATCH=12"]
    # not a drain, or a runner that said nothing: every line of the run
    assert after_run.batch_matches("{ path=/usr/local/bin/job ; }", "4242", "batch 12 ended: x") == []
    assert after_run.batch_matches(runner, "4242", "") == []


def mail_spec(tmp_path, encrypted, **item):
    """The runtime spec the role writes for a consumer "mail", as this program reads it back."""
    consumer = consumer_spec.normalize_consumers([dict({"name": "mail", "command": "/bin/true"}, **item)])[0]
    settings = {"metrics": True, "metrics_dir": "/var/lib/textfiles", "prefix": "batchq-", "helper_dir": str(tmp_path)}
    specs = consumer_runtime.runtime_specs([consumer], settings, encrypted)
    path = tmp_path / "mail.json"
    path.write_text(consumer_runtime.spec_text(specs["mail"]["spec"]))
    return after_run.protocol.read_spec(str(path))


def test_a_hook_unit_loads_the_hook_credentials_as_the_role_wrote_them(tmp_path):
    hooked = {"on_failure": "/usr/bin/logger failed", "hook_credentials": {"token": "t", "key": "k"}}
    assert after_run.credential_properties(mail_spec(tmp_path, True, **hooked)["hook_credentials"]) == [
        "--property=LoadCredentialEncrypted=key:/etc/batchq/mail.key.hookcred-encrypted",
        "--property=LoadCredentialEncrypted=token:/etc/batchq/mail.token.hookcred-encrypted"]
    assert after_run.credential_properties(mail_spec(tmp_path, False, **hooked)["hook_credentials"])[0] == (
        "--property=LoadCredential=key:/etc/batchq/mail.key.hookcred")
    assert after_run.credential_properties(mail_spec(tmp_path, False)["hook_credentials"]) == []


def test_a_spec_that_is_not_the_roles_is_refused_naming_the_file_and_field(tmp_path):
    path = tmp_path / "mail.json"
    spec = json.loads(consumer_runtime.spec_text(mail_spec(tmp_path, False)))
    for broken, field in ((dict(spec, interval_usec="10s"), "interval_usec"), (dict(spec, spec_version=2), "spec_version"),
                          ({k: v for k, v in spec.items() if k != "services"}, "services")):
        path.write_text(json.dumps(broken))
        with pytest.raises(after_run.protocol.SpecError, match="%s.*%s" % (path, field)):
            after_run.protocol.read_spec(str(path))
    # the unit's ExecStopPost= never fails the run: one line on stderr, exit 0
    assert after_run.main(["--spec", str(path), "--unit", "batchq-mail.service"]) == 0


def test_a_state_written_over_a_longer_one_is_whole_at_each_step(tmp_path):
    path = tmp_path / "consumer.json"
    old = json.dumps({"batchq-x.service": {"failures": 12, "since": 1.5, "notified": 3.25}}).encode()
    new = json.dumps({}).encode()
    path.write_bytes(old)
    descriptor = os.open(path, os.O_RDWR)
    try:
        # the write alone, as a run killed before the cut leaves it
        os.pwrite(descriptor, new.ljust(len(old)), 0)
        assert json.loads(path.read_bytes()) == {}
        path.write_bytes(old)
        after_run.write_over(descriptor, new)
    finally:
        os.close(descriptor)
    assert path.read_bytes() == b"{}"
