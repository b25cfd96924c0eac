"""consumer_info's main() when a command fails in one of its journal threads.

The systemctl output is recorded (fixtures/bookworm); the journal call of one
consumer fails, which a real host does not do on demand, hence the patch.
"""

import contextlib
import json
import pathlib
import threading

import pytest

from ansible.module_utils import basic
from ansible_collections.batchq.consumers.plugins.modules import consumer_info

try:
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core before 2.19 reads a module's arguments from basic._ANSIBLE_ARGS

    @contextlib.contextmanager
    def patch_module_args(args):
        saved = basic._ANSIBLE_ARGS
        basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode()
        try:
            yield
        finally:
            basic._ANSIBLE_ARGS = saved


FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "bookworm"


class Exit(Exception):
    pass


def test_a_failed_journal_read_fails_the_module_once_from_the_main_thread(monkeypatch):
    calls = []

    def run_command(self, argv, **kwargs):
        if argv[1] == "list-unit-files":
            return 0, (FIXTURES / "units.txt").read_text(), ""
        if argv[1] == "list-units":
            return 0, "", ""
        if argv[1] == "show":
            name = "show-services.txt" if argv[-1].endswith(".service") else "show-timers.txt"
            return 0, (FIXTURES / name).read_text(), ""
        if "UNIT=batchq-hung.service" in argv:
            return 1, "", "Failed to open journal"
        return 0, "", ""

    def fail_json(self, **result):
        calls.append((threading.current_thread() is threading.main_thread(), result))
        raise Exit()

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, required=False: "/bin/" + name)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    monkeypatch.setattr(consumer_info, "journal_refusal", lambda: None)
    with patch_module_args({}), pytest.raises(Exit):
        consumer_info.main()
    assert len(calls) == 1, calls
    in_main_thread, result = calls[0]
    assert in_main_thread
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
