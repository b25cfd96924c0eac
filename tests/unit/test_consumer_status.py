"""The fleet table and the monitoring verdicts of consumer_status."""

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_status import problems, table

NOW = 1795953900.0  # 2026-11-29T12:05:00Z


def consumer(state, result=None, finished=None, duration=None, failures=0, runs=0, next_run=None):
    last = None if result is None else {"result": result, "finished": finished, "duration_s": duration}
    return {"state": state, "last_run": last, "timer": {"next_run": next_run},
            "summary": {"failures": failures, "runs": runs}}


REPORTS = {
    "web-2": {"thumbs": consumer("waiting", "success", "2026-11-29T12:04:30Z", 3.25, 0, 5, "2026-11-29T12:05:30.5Z")},
    "web-1": {
        "thumbs": consumer("failed", "exit-code", "2026-11-29T10:00:00Z", 0.5, 2, 5),
        "report": consumer("paused"),
    },
}


def test_table_is_aligned_sorted_and_readable():
    lines = table(REPORTS, NOW)
    assert lines[0].split() == ["host", "consumer", "state", "last", "result", "last", "run", "duration", "next", "run",
                                "failures"]
    assert lines[1].split() == ["web-1", "report", "paused", "-", "never", "-", "-", "0/0"]
    assert lines[2].split() == ["web-1", "thumbs", "failed", "exit-code", "2h", "ago", "0.5s", "-", "2/5"]
    assert lines[3].split() == ["web-2", "thumbs", "waiting", "success", "30s", "ago", "3.2s", "2026-11-29", "12:05:30",
                                "0/5"]
    assert lines[0].index("state") == lines[1].index("paused") == lines[3].index("waiting")


def test_nothing_fails_unless_asked():
    assert problems(REPORTS, NOW) == []


def test_failed_last_run_fails_the_check():
    assert problems(REPORTS, NOW, fail_on_failed=True) == ["thumbs on web-1: failed (last result exit-code)"]


def test_overdue_consumers_fail_the_check_but_paused_ones_do_not():
    assert problems(REPORTS, NOW, max_age=3600) == ["thumbs on web-1: no run ended in the last 3600s"]
    assert problems(REPORTS, NOW, max_age=10) == ["thumbs on web-1: no run ended in the last 10s",
                                                  "thumbs on web-2: no run ended in the last 10s"]


STOPPED = {"web-3": {"halted": consumer("stopped", "success", "2026-11-29T12:04:50Z", 1.0, 0, 5)}}


def test_a_timer_stopped_by_hand_fails_the_check_on_failures():
    assert problems(STOPPED, NOW) == []
    assert problems(STOPPED, NOW, fail_on_failed=True) == [
        "halted on web-3: stopped (timer enabled but inactive or failed, last result success)"]


def test_a_stopped_consumer_is_not_excused_from_max_age():
    assert problems(STOPPED, NOW, max_age=3600) == []  # its last run ended 10s ago
    assert problems(STOPPED, NOW, max_age=5) == ["halted on web-3: no run ended in the last 5s"]
