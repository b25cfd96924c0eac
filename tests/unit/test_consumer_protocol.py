"""The run protocol both ways: what the host-side programs write, consumer_info reads back."""

import pytest

from ansible_collections.batchq.consumers.plugins.module_utils import consumer_protocol as protocol

BACKLOG = 75


@pytest.mark.parametrize("returncode, timed_out, expected", [
    (0, False, ("success", 0)),
    (BACKLOG, False, ("backlog", BACKLOG)),
    (3, False, ("exit-code", 3)),
    (-15, False, ("signal", "TERM")),
    (-9, True, ("timeout", "KILL")),
    (0, True, ("timeout", 0)),
    (BACKLOG, True, ("timeout", BACKLOG)),
])
def test_a_batchs_outcome_from_its_return_code(returncode, timed_out, expected):
    assert protocol.batch_outcome(returncode, BACKLOG, timed_out) == expected


@pytest.mark.parametrize("number, result, status, seconds", [
    (1, "success", 0, 0.0), (12, "backlog", BACKLOG, 0.1034), (3, "signal", "SEGV", 61.5),
    (100000, "timeout", "TERM", 3600.0), (2, "exit-code", 127, 0.0005), (4, "signal", "RTMIN+2", 1.0),
])
def test_the_status_text_is_read_back_as_written(number, result, status, seconds):
    text = protocol.status_text(number, result, status, seconds)
    assert protocol.parse_status_text(text) == {"number": number, "result": result, "exit_status": status,
                                                "duration_s": round(seconds, 3)}


def test_the_status_text_reads_as_systemctl_shows_it():
    assert protocol.status_text(12, "backlog", BACKLOG, 0.103) == "batch 12 ended: backlog 75 after 0.103s"


@pytest.mark.parametrize("text", [None, "", "drain started", "batch x ended: success 0 after 1s",
                                  "batch 1 ended: success 0 after 1s and more"])
def test_any_other_status_text_tells_of_no_batch(text):
    assert protocol.parse_status_text(text) is None


def test_the_end_record_is_read_back_as_written():
    fields = protocol.batch_end_fields(7, "signal", "TERM", 1000.25, 1003.5, "consume#7")
    # journald hands every value back as text
    entry = {key: str(value) for key, value in fields.items()}
    assert entry["MESSAGE_ID"] == protocol.BATCH_END
    assert entry["MESSAGE"] == "batch 7 ended: signal TERM after 3.250s"
    assert entry["PRIORITY"] == "4"
    assert protocol.parse_batch_end(entry) == {"number": 7, "started": 1000.25, "finished": 1003.5,
                                               "duration_s": 3.25, "result": "signal", "exit_status": "TERM"}
    assert set(protocol.BATCH_FIELDS) <= set(entry)


@pytest.mark.parametrize("result, priority", [("success", 6), ("backlog", 6), ("exit-code", 4), ("timeout", 4)])
def test_only_a_failed_batch_is_a_warning(result, priority):
    assert protocol.batch_end_fields(1, result, 0, 0.0, 1.0, "x#1")["PRIORITY"] == priority


@pytest.mark.parametrize("code, status, expected, number", [
    ("exited", "0", 0, 0), ("exited", "3", 3, 3), ("killed", "SEGV", "SEGV", 139), ("killed", "9", "KILL", 137),
    ("dumped", "ABRT", "ABRT", 134), ("dumped", "6", "ABRT", 134), ("", None, None, 0), ("exited", "", None, 0),
    # real-time signals, as systemd names them (signal_to_string())
    ("killed", "35", "RTMIN+1", 163), ("killed", "RTMIN+3", "RTMIN+3", 165), ("killed", "34", "RTMIN", 162),
])
def test_exit_status_as_systemd_says_it_and_as_a_number(code, status, expected, number):
    assert protocol.exit_status(code, status) == expected
    assert protocol.exit_status_number(protocol.exit_status(code, status)) == number


def test_a_drains_last_batch_is_found_by_its_runner_and_number():
    batch = protocol.parse_status_text("batch 4 ended: exit-code 1 after 0.200s")
    assert protocol.batch_journal_matches("812", batch) == ["_PID=812", "BATCHQ_BATCH=4"]


@pytest.mark.parametrize("number", list(range(1, 32)) + list(range(34, 65)))
def test_every_signal_name_leads_back_to_its_number(number):
    name = protocol.signal_name(number)
    if not name.isdigit():  # 16 and 32/33 have no name on some systems
        assert protocol.signal_number(name) == number
        assert protocol.exit_status_number(name) == 128 + number
