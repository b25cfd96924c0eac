"""What consumer_control.yml knows of a host: read from the timer files the
role writes (templates/consumer.timer.j2, rendered here as the role does)."""

import pathlib

import jinja2

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_deployed import (
    deployed_consumer,
    read_timer_settings,
    running,
    select,
    timer_settings,
)
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import normalize_consumers

TEMPLATE = pathlib.Path(__file__).parents[2] / "roles" / "consumer" / "templates" / "consumer.timer.j2"


def rendered(consumer, metrics=True):
    (normalized,) = normalize_consumers([consumer])
    environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["comment"] = lambda text: "# " + text
    return environment.from_string(TEMPLATE.read_text()).render(
        _consumer=normalized, ansible_managed="managed", _consumer_metrics=metrics,
        consumer_metrics_dir="/var/lib/prometheus/node-exporter")


def test_the_settings_a_resume_needs_come_from_the_role_s_own_lines():
    text = rendered({"name": "thumbs", "command": "/bin/true", "start_delay": "1min 30s", "accuracy": "100ms",
                     "jitter": "7s", "instances": 3, "state": "paused",
                     # timer_options come after the role's lines; the deploy starts with the role's
                     "timer_options": {"AccuracySec": "5s", "OnBootSec": "10min"}})
    assert timer_settings(text) == {"start_delay": "1min 30s", "accuracy": "100ms", "jitter": "7s",
                                    "instances": 3, "min_instances": None, "state": "paused",
                                    "metrics_dir": "/var/lib/prometheus/node-exporter"}


def test_without_metrics_or_a_record():
    assert timer_settings(rendered({"name": "x", "command": "/bin/true"}, metrics=False))["metrics_dir"] is None
    # a timer file written before the role kept its record
    old = "[Timer]\nOnBootSec=5s\nAccuracySec=1s\nRandomizedDelaySec=0\n"
    assert timer_settings(old) == {"start_delay": "5s", "accuracy": "1s", "jitter": "0", "instances": None,
                                   "min_instances": None, "state": "present", "metrics_dir": None}


def test_a_paused_template_has_its_instances_from_the_record_only():
    settings = timer_settings(rendered({"name": "thumbs", "command": "/bin/true", "instances": 2}))
    consumer = deployed_consumer("thumbs", "batchq-", settings, [])
    assert consumer["timers"] == ["batchq-thumbs@1.timer", "batchq-thumbs@2.timer"]
    assert consumer["services"] == ["batchq-thumbs@1.service", "batchq-thumbs@2.service"]
    assert consumer["starts"][1] == {"timer": "batchq-thumbs@2.timer", "delay": "5s", "accuracy": "1s",
                                     "jitter": "0"}
    without_record = dict(settings, instances=None)
    assert deployed_consumer("thumbs", "batchq-", without_record, ["10", "2"])["timers"] == [
        "batchq-thumbs@2.timer", "batchq-thumbs@10.timer"]
    assert deployed_consumer("thumbs", "batchq-", without_record, []) is None


def test_a_range_of_instances_resumes_and_runs_up_to_min_and_pauses_and_waits_for_all():
    settings = timer_settings(rendered({"name": "thumbs", "command": "/bin/true", "backlog_exit_code": 75,
                                        "instances": {"min": 2, "max": 4}}))
    assert (settings["min_instances"], settings["instances"]) == (2, 4)
    consumer = deployed_consumer("thumbs", "batchq-", settings, ["1", "2", "3"])
    assert consumer["timers"] == ["batchq-thumbs@%d.timer" % n for n in (1, 2, 3, 4)]
    assert consumer["services"] == ["batchq-thumbs@%d.service" % n for n in (1, 2, 3, 4)]
    assert [start["timer"] for start in consumer["starts"]] == ["batchq-thumbs@1.timer", "batchq-thumbs@2.timer"]
    assert consumer["scheduled_services"] == ["batchq-thumbs@1.service", "batchq-thumbs@2.service"]
    # one woken above a max a deploy lowered since: a pause and a wait take it, a resume and a run never
    lowered = deployed_consumer("thumbs", "batchq-", dict(settings, instances=3), ["1", "3", "4", "10"])
    assert lowered["timers"] == ["batchq-thumbs@%d.timer" % n for n in (1, 2, 3, 4, 10)]
    assert lowered["scheduled_services"] == ["batchq-thumbs@1.service", "batchq-thumbs@2.service"]
    # a fixed count schedules all its instances
    fixed = deployed_consumer("thumbs", "batchq-", timer_settings(rendered(
        {"name": "thumbs", "command": "/bin/true", "instances": 3})), [])
    assert fixed["scheduled_services"] == fixed["services"] and len(fixed["starts"]) == 3
    # and never one above it that is still loaded
    above = deployed_consumer("thumbs", "batchq-", timer_settings(rendered(
        {"name": "thumbs", "command": "/bin/true", "instances": 3})), ["4"])
    assert above["services"][-1] == "batchq-thumbs@4.service" and len(above["starts"]) == 3
    assert above["scheduled_services"] == fixed["services"]


def test_a_plain_consumer_has_one_timer():
    consumer = deployed_consumer("x", "q-", timer_settings(rendered({"name": "x", "command": "/bin/true"})), None)
    assert (consumer["timers"], consumer["services"], consumer["instances"]) == (["q-x.timer"], ["q-x.service"], 1)


def test_all_is_every_present_consumer_and_an_empty_list_none():
    found = [{"name": "a", "state": "present"}, {"name": "b", "state": "paused"}]
    assert select(found, None) == ([found[0]], [])
    assert select(found, []) == ([], [])
    assert select(found, ["b", "nosuch", "b"]) == ([found[1]], ["nosuch"])


def test_a_batch_runs_while_activating_or_deactivating():
    show = {"a.service": {"ActiveState": "activating"}, "b.service": {"ActiveState": "deactivating"},
            "c.service": {"ActiveState": "inactive"}, "d.service": {"ActiveState": "failed"}}
    assert running(show, ["a.service", "b.service", "c.service", "d.service"]) == ["a.service", "b.service"]


def test_a_timer_file_edited_by_hand_is_read_and_a_missing_one_is_none(tmp_path):
    edited = tmp_path / "batchq-x@.timer"
    edited.write_bytes(b"[Timer]\n# caf\xe9\n\n[X-Batchq]\nInstances=2\n")
    assert read_timer_settings(str(edited))["instances"] == 2
    assert read_timer_settings(str(tmp_path / "gone.timer")) is None
