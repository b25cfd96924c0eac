"""consumer_files on a real folder: each state, what changes, and a second run that changes nothing."""

import os
import stat

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_metrics import metrics_files, paused_text
from ansible_collections.batchq.consumers.plugins.modules import consumer_files

CONSUMERS = [{"name": "mail", "user": None, "group": None, "state": "present"},
             {"name": "sync", "user": None, "group": None, "state": "paused"}]


def entries(folder, **options):
    # user and group None: the test runs as whoever it runs as
    found = metrics_files(CONSUMERS, str(folder), "batchq-", **options)
    defaults = {"state": "file", "content": "", "force": True, "src": None, "owner": None, "group": None, "mode": None}
    return [dict(defaults, **entry) for entry in found]


def run(files):
    changed = []
    for entry in files:
        if consumer_files.needs_change(entry):
            changed.append(entry["path"])
            consumer_files.apply(entry)
    return changed


def test_metrics_files_are_laid_out_once_and_a_second_run_changes_nothing(tmp_path):
    changed = run(entries(tmp_path))
    assert sorted(os.path.relpath(path, tmp_path) for path in changed) == sorted([
        "batchq-mail.d", "batchq-mail.d/metrics.prom", "batchq-mail.prom", "batchq-mail.paused.prom",
        "batchq-sync.d", "batchq-sync.d/metrics.prom", "batchq-sync.prom", "batchq-sync.paused.prom"])
    assert os.readlink(tmp_path / "batchq-mail.prom") == "batchq-mail.d/metrics.prom"
    assert (tmp_path / "batchq-mail.prom").read_text() == ""
    assert (tmp_path / "batchq-sync.paused.prom").read_text() == paused_text("sync", True)
    assert 'batchq_consumer_paused{consumer="mail"} 0' in (tmp_path / "batchq-mail.paused.prom").read_text()
    assert stat.S_IMODE(os.stat(tmp_path / "batchq-mail.paused.prom").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "batchq-mail.d").st_mode) == 0o755
    assert run(entries(tmp_path)) == []


def test_the_counters_file_is_never_overwritten(tmp_path):
    run(entries(tmp_path))
    (tmp_path / "batchq-mail.d" / "metrics.prom").write_text("counters\n")
    os.chmod(tmp_path / "batchq-mail.d" / "metrics.prom", 0o600)
    assert run(entries(tmp_path)) == []
    assert (tmp_path / "batchq-mail.prom").read_text() == "counters\n"


def test_pause_and_resume_rewrite_only_the_paused_files(tmp_path):
    run(entries(tmp_path))
    changed = run(entries(tmp_path, paused=True, only_paused=True))
    assert changed == [str(tmp_path / "batchq-mail.paused.prom")]  # sync was paused already
    assert run(entries(tmp_path, paused=False, only_paused=True)) == [
        str(tmp_path / "batchq-mail.paused.prom"), str(tmp_path / "batchq-sync.paused.prom")]


def test_metrics_off_removes_every_file_and_folder(tmp_path):
    run(entries(tmp_path))
    (tmp_path / "other.prom").write_text("")
    assert len(run(entries(tmp_path, enabled=False))) == 6
    assert sorted(os.listdir(tmp_path)) == ["other.prom"]
    assert run(entries(tmp_path, enabled=False)) == []


def test_a_wrong_thing_in_the_way_is_replaced(tmp_path):
    (tmp_path / "batchq-mail.prom").write_text("a file where the link goes")
    (tmp_path / "batchq-mail.paused.prom").mkdir()
    run(entries(tmp_path))
    assert os.path.islink(tmp_path / "batchq-mail.prom")
    assert (tmp_path / "batchq-mail.paused.prom").read_text() == paused_text("mail", False)
