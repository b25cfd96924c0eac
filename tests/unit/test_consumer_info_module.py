"""consumer_info's main() when a command fails in one of its journal threads.

The systemctl output is recorded (fixtures/bookworm); the shared journal read
is cut short by a busy consumer, so each other consumer is read on its own,
and the read of one fails, which a real host does not do on demand, hence the patch.
"""

import json
import pathlib
import threading

import pytest

from ansible.module_utils import basic
from ansible_collections.batchq.consumers.plugins.modules import consumer_info

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "bookworm"


class Exit(Exception):
    pass


def recorded_systemctl(argv):
    """What the recorded Debian 12 host (FIXTURES) answers to systemctl argv: its consumers' unit
    files, no unit running, their properties."""
    if argv[1] == "list-unit-files":
        return 0, (FIXTURES / "units.txt").read_text(), ""
    if argv[1] == "list-units":
        return 0, "", ""
    # the services are shown with batchq.slice (the host's budget), which this host has not
    name = "show-services.txt" if any(arg.endswith(".service") for arg in argv) else "show-timers.txt"
    return 0, (FIXTURES / name).read_text(), ""


def run_main(monkeypatch, module_args, run_command):
    """consumer_info's main() with no options, on a host that answers run_command(self, argv):
    how it ended, [(exit_json or fail_json, called from the main thread, its result)]."""
    ends = []

    def ending(kind):
        def end(self, **result):
            ends.append((kind, threading.current_thread() is threading.main_thread(), result))
            raise Exit()
        return end

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, required=False: "/bin/" + name)
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", ending("exit_json"))
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", ending("fail_json"))
    monkeypatch.setattr(consumer_info, "journal_refusal", lambda: None)
    with module_args({}), pytest.raises(Exit):
        consumer_info.main()
    return ends


def test_a_failed_journal_read_fails_the_module_once_from_the_main_thread(monkeypatch, module_args):
    calls = []

    def run_command(self, argv, **kwargs):
        if argv[1] in ("list-unit-files", "list-units", "show"):
            return recorded_systemctl(argv)
        units = [arg for arg in argv if arg.startswith("UNIT=")]
        if len(units) > 1:
            limit = int(next(arg for arg in argv if arg.startswith("--lines="))[len("--lines="):])
            busy = json.dumps({"UNIT": "batchq-busy.service", "INVOCATION_ID": "1", "__REALTIME_TIMESTAMP": "1"})
            return 0, "\n".join([busy] * limit) + "\n", ""
        if units == ["UNIT=batchq-hung.service"]:
            calls.append(("hung read alone", threading.current_thread() is threading.main_thread()))
            return 1, "", "Failed to open journal"
        return 0, "", ""

    ends = run_main(monkeypatch, module_args, run_command)
    assert calls == [("hung read alone", False)], calls
    assert len(ends) == 1, ends
    kind, in_main_thread, result = ends[0]
    assert kind == "fail_json" and in_main_thread
    assert result["msg"].startswith("hung: ") and "Failed to open journal" in result["msg"], json.dumps(result)


def test_a_user_who_cannot_read_the_journal_is_told_so(monkeypatch, tmp_path):
    journal = tmp_path / "system.journal"
    journal.write_text("")
    monkeypatch.setattr(consumer_info, "JOURNAL_FILES", (str(journal),))
    monkeypatch.setattr(consumer_info.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(consumer_info.pwd, "getpwuid", lambda uid: type("pw", (), {"pw_name": "alice"}))
    monkeypatch.setattr(consumer_info.os, "access", lambda path, mode: False)
    refusal = consumer_info.journal_refusal()
    assert "alice" in refusal and str(journal) in refusal and "systemd-journal" in refusal
    monkeypatch.setattr(consumer_info.os, "access", lambda path, mode: path == str(journal))
    assert consumer_info.journal_refusal() is None


class FakeModule:
    """Answers journalctl with recorded JSON lines, newest first, as --reverse does."""

    def __init__(self, lines):
        self.lines, self.argvs = lines, []

    def get_bin_path(self, name, required=False):
        return "/bin/" + name

    def run_command(self, argv, **kwargs):
        self.argvs.append(argv)
        limit = int(next(arg for arg in argv if arg.startswith("--lines="))[len("--lines="):])
        return 0, "".join(line + "\n" for line in self.lines[:limit]), ""


def entry(unit, invocation, when):
    return json.dumps({"UNIT": unit, "INVOCATION_ID": invocation, "__REALTIME_TIMESTAMP": str(when),
                       "MESSAGE_ID": "7ad2d189f7e94e70a38c781354912448"})


def test_one_journal_read_gives_each_service_its_runs_unless_crowded_out():
    # history 0: each service needs its newest 10 messages; 2 services: a read of 20
    busy = [entry("batchq-busy.service", "b%d" % i, 2000 - i) for i in range(19)]
    quiet = [entry("batchq-quiet.service", "q1", 1000)]
    module = FakeModule(busy + quiet)
    runs = consumer_info.Host(module).runs(["batchq-busy.service", "batchq-quiet.service"], 0)
    assert len(module.argvs) == 1 and module.argvs[0].count("UNIT=batchq-busy.service") == 1
    # 20 lines came back, the limit: quiet's one message may not be its newest 10
    assert list(runs) == ["batchq-busy.service"]
    assert [run["invocation_id"] for run in runs["batchq-busy.service"]] == ["b%d" % i for i in range(10)]
    module = FakeModule(busy[:5] + quiet)
    runs = consumer_info.Host(module).runs(["batchq-busy.service", "batchq-quiet.service"], 0)
    assert sorted(runs) == ["batchq-busy.service", "batchq-quiet.service"]
    assert [run["invocation_id"] for run in runs["batchq-quiet.service"]] == ["q1"]


def test_every_last_run_gets_its_own_log_from_the_shared_read(monkeypatch, module_args):
    log_reads = []  # the journal reads that asked for the output of runs

    def run_command(self, argv, **kwargs):
        if argv[1] in ("list-unit-files", "list-units", "show"):
            return recorded_systemctl(argv)
        invocations = [arg.split("=", 1)[1] for arg in argv if arg.startswith("_SYSTEMD_INVOCATION_ID=")]
        if invocations:
            log_reads.append(invocations)
        lines = [json.dumps({"_SYSTEMD_INVOCATION_ID": one, "MESSAGE": "output of " + one}) for one in invocations]
        return 0, "".join(line + "\n" for line in lines), ""

    (kind, _main_thread, result), = run_main(monkeypatch, module_args, run_command)
    assert kind == "exit_json", result
    reports = result["consumers"]
    last_runs = [report["last_run"] for report in reports.values()
                 if report["last_run"] and report["last_run"]["invocation_id"]]
    assert last_runs
    assert all(last["log"] == ["output of " + last["invocation_id"]] for last in last_runs), last_runs
    # one read for them all, which asked for each last run once (none of these runs is a drain's)
    assert len(log_reads) == 1, log_reads
    assert sorted(log_reads[0]) == sorted(last["invocation_id"] for last in last_runs), (log_reads, last_runs)


@pytest.mark.parametrize("count, reads", [(0, 0), (1, 1), (15, 1), (16, 2), (31, 3), (50, 4), (400, 4)])
def test_many_services_are_read_in_up_to_four_shares_that_hold_each_once(count, reads):
    services = ["batchq-c%03d.service" % i for i in range(count)]
    parts = consumer_info.shares(services)
    assert len(parts) == reads
    assert sorted(service for part in parts for service in part) == services
    assert all(len(part) >= 8 for part in parts) or reads <= 1


def test_a_host_without_consumers_reports_none_though_its_systemd_says_so_with_exit_1(monkeypatch, module_args):
    """systemd 257 (Debian 13) exits 1 from list-unit-files when no unit file
    matches, with no output at all (seen on a batchq/debian:trixie container)."""
    def run_command(self, argv, **kwargs):
        if argv[1] == "list-unit-files":
            return 1, "", ""
        if argv[1] == "list-units":
            return 0, "", ""
        raise AssertionError("nothing else to ask of a host without consumers: %s" % argv)

    (kind, _main_thread, report), = run_main(monkeypatch, module_args, run_command)
    assert kind == "exit_json", report
    assert report["consumers"] == {}


def test_a_listing_that_fails_with_words_still_fails_the_module(monkeypatch, module_args):
    def run_command(self, argv, **kwargs):
        return (1, "", "Failed to connect to bus") if argv[1] == "list-unit-files" else (0, "", "")

    (kind, _main_thread, result), = run_main(monkeypatch, module_args, run_command)
    assert kind == "fail_json" and "Failed to connect to bus" in result["msg"], result


def test_the_instances_of_a_consumer_are_counted_from_the_record_in_its_timer_template(monkeypatch, tmp_path):
    """A paused consumer's instances are not loaded (systemctl lists only its
    templates): the record the role writes in the timer's file counts them."""
    records = {"fixed": "Instances=3\nState=paused\n", "ranged": "Instances=4\nMinInstances=1\nState=present\n",
               "old": "", "equal": "Instances=2\nMinInstances=2\n"}
    for name, record in records.items():
        (tmp_path / ("batchq-%s@.timer" % name)).write_text(
            "[Timer]\nOnUnitInactiveSec=10s\n" + ("[X-Batchq]\n" + record if record else ""))
    monkeypatch.setattr(consumer_info, "UNIT_DIR", str(tmp_path))
    found = {name: {"service": "batchq-%s@.service" % name, "timer": "batchq-%s@.timer" % name, "template": "disabled"}
             for name in records}
    found["plain"] = {"service": "batchq-plain.service", "timer": "batchq-plain.timer"}
    assert consumer_info.instance_counts(found, "batchq-") == {"fixed": (3, 3), "ranged": (1, 4), "equal": (2, 2)}
