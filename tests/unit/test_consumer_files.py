"""consumer_files on a real folder: each state, what changes, and a second run that changes nothing."""

import json
import os
import stat

import pytest

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


def test_root_never_follows_a_link_planted_in_a_folder_the_consumer_writes(tmp_path, monkeypatch):
    """A drain's metrics folder is writable by the consumer: one that swaps the
    new file for a link (between the rename and the chown, or before a run
    that only fixes the mode) must not have root change the link's target."""
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    os.chmod(victim, 0o600)
    path = tmp_path / "metrics.prom"
    entry = {"path": str(path), "state": "file", "content": "x 1\n", "force": True, "src": None,
             "owner": None, "group": None, "mode": "0644"}
    rename = os.rename

    def rename_then_plant(source, target):
        rename(source, target)
        os.unlink(target)
        os.symlink(victim, target)  # the consumer wins the race

    monkeypatch.setattr(os, "rename", rename_then_plant)
    consumer_files.apply(entry)
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o600, "root changed the mode of the link's target"
    monkeypatch.setattr(os, "rename", rename)
    # a planted link before a run whose content is right: replaced, never followed
    os.unlink(path)
    os.symlink(victim, path)
    assert consumer_files.needs_change(entry)
    consumer_files.apply(entry)
    assert not os.path.islink(path) and path.read_text() == "x 1\n"
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o600 and victim.read_text() == "root's own\n"


def test_shared_helpers_go_once_no_unit_names_them(tmp_path):
    units, helpers = tmp_path / "system", tmp_path / "lib"
    units.mkdir()
    helpers.mkdir()
    (helpers / "batchq-drain").write_text("")
    (units / "batchq.continue@.service").write_text("[Service]\n")
    (units / "other-a.service").write_text("OnSuccess=batchq.continue@%N.service\nExecStart=/lib/batchq-drain 75\n")
    (units / "batchq-b.service").write_text("OnSuccess=batchq.continue@%N.service\n")
    entries = [{"path": str(units / "batchq.continue@.service"), "named_by": ["batchq.continue@"]},
               {"path": str(helpers / "batchq-drain"), "named_by": ["/lib/batchq-drain"]}]
    # a unit of another prefix still uses both
    assert consumer_files.unused_paths(entries, str(units), {str(units / "batchq-b.service")}) == []
    (units / "other-a.service").write_text("ExecStart=/bin/true\n")
    # the continuation's own file does not keep it; a unit on its way out does not either
    assert consumer_files.unused_paths(entries, str(units), {str(units / "batchq-b.service")}) == [
        str(units / "batchq.continue@.service"), str(helpers / "batchq-drain")]


def test_a_removed_consumer_is_named_and_its_metrics_go(tmp_path):
    run(entries(tmp_path))
    gone = metrics_files(["mail"], str(tmp_path), "batchq-", enabled=False)
    assert sorted(os.path.relpath(path, tmp_path) for path in run(gone)) == [
        "batchq-mail.d", "batchq-mail.paused.prom", "batchq-mail.prom"]
    assert sorted(os.listdir(tmp_path)) == ["batchq-sync.d", "batchq-sync.paused.prom", "batchq-sync.prom"]


def test_a_mode_that_adds_rights_never_takes_one_away(tmp_path):
    folder = tmp_path / "textfiles"
    folder.mkdir()
    os.chmod(folder, 0o1733)  # a sticky folder other exporters write to
    entry = {"path": str(folder), "state": "directory", "owner": None, "group": None, "mode": "a+rx"}
    assert run([entry]) == [str(folder)]
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o1777
    assert run([entry]) == []
    assert consumer_files.wanted_mode("0644", 0o777) == 0o644
    assert consumer_files.wanted_mode("u+w", 0o444) == 0o644
    assert consumer_files.wanted_mode(None, 0o750) == 0o750


def test_a_mode_that_is_neither_octal_nor_an_addition_is_refused():
    try:
        consumer_files.wanted_mode("a=rx", 0o755)
    except ValueError as exc:
        assert "a=rx" in str(exc)
    else:
        raise AssertionError("a=rx was taken")


def test_a_credential_is_written_root_only_once_and_rewritten_when_its_value_changes(tmp_path):
    credential = {"path": str(tmp_path / "mail.token.cred"), "name": "token", "value": "s3cret\nline two"}
    assert consumer_files.credential_differs(None, credential, encrypt=False)
    consumer_files.write_credential(None, credential, encrypt=False)
    info = os.stat(credential["path"])
    assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, 0)
    assert open(credential["path"], "rb").read() == b"s3cret\nline two"
    assert not consumer_files.credential_differs(None, credential, encrypt=False)
    assert consumer_files.credential_differs(None, dict(credential, value="rotated"), encrypt=False)
    os.chmod(credential["path"], 0o644)
    assert consumer_files.credential_differs(None, credential, encrypt=False)
    # no temporary file is left beside it
    assert os.listdir(tmp_path) == ["mail.token.cred"]


def test_the_module_returns_the_credential_paths_it_changed_and_never_a_value(tmp_path, capsys, module_args):
    """changed_paths tells the role which drains to end: the paths come back as they are,
    the values nowhere, whatever name the credential has (Ansible masks what no_log marks)."""
    path = str(tmp_path / "mail.tmp.cred")  # the name is part of its own path
    with module_args({"credentials": [{"path": path, "name": "tmp", "value": "s3cret-value"}]}), \
            pytest.raises(SystemExit):
        consumer_files.main()
    out = capsys.readouterr().out
    assert json.loads(out)["changed_paths"] == [path]
    assert "s3cret-value" not in out


def run_main(module_args, capsys, check_mode=False, **args):
    """consumer_files' main() with args; returns what it printed, parsed."""
    if check_mode:
        args["_ansible_check_mode"] = True
    with module_args(args), pytest.raises(SystemExit):
        consumer_files.main()
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("check_mode", [True, False])
def test_the_missing_folders_above_every_kind_of_entry_are_made_root_s_0755(tmp_path, capsys, module_args,
                                                                            check_mode):
    """A bare host has no /var/lib/prometheus: the metrics folder's parents are
    made, and so are those of a file, a link, a secret file and a credential."""
    old_umask = os.umask(0o077)  # a strict umask must not make them unreadable
    try:
        result = run_main(module_args, capsys, check_mode=check_mode, files=[
            {"path": str(tmp_path / "var/lib/prometheus/node-exporter"), "state": "directory", "mode": "a+rx"},
            {"path": str(tmp_path / "usr/local/lib/batchq/batchq-drain"), "content": "#!/bin/sh\n", "mode": "0755"},
            {"path": str(tmp_path / "links/deep/batchq-x.prom"), "state": "link", "src": "batchq-x.d/metrics.prom"}],
            secret_files={str(tmp_path / "etc/batchq/x.env"): "TOKEN=s3cret-env\n"},
            credentials=[{"path": str(tmp_path / "creds/x.token.cred"), "name": "token", "value": "s3cret-credential"}])
    finally:
        os.umask(old_umask)
    made = ["var", "var/lib", "var/lib/prometheus", "var/lib/prometheus/node-exporter",
            "usr", "usr/local", "usr/local/lib", "usr/local/lib/batchq", "usr/local/lib/batchq/batchq-drain",
            "links", "links/deep", "links/deep/batchq-x.prom", "etc", "etc/batchq", "etc/batchq/x.env",
            "creds", "creds/x.token.cred"]
    assert result["changed"] and result["changed_paths"] == [str(tmp_path / path) for path in made]
    if check_mode:
        assert os.listdir(tmp_path) == []
        return
    for parent in ("var", "var/lib/prometheus", "usr/local/lib/batchq", "links/deep", "etc/batchq", "creds"):
        info = os.stat(tmp_path / parent)
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o755, os.getuid()), parent
    assert stat.S_IMODE(os.stat(tmp_path / "var/lib/prometheus/node-exporter").st_mode) & 0o555 == 0o555
    assert (tmp_path / "etc/batchq/x.env").read_text() == "TOKEN=s3cret-env\n"


def test_an_entry_to_remove_makes_no_folder(tmp_path, capsys, module_args):
    result = run_main(module_args, capsys, absent=[str(tmp_path / "gone/x.env")],
                      files=[{"path": str(tmp_path / "gone/too/x.prom"), "state": "absent"}])
    assert (result["changed"], os.listdir(tmp_path)) == (False, [])


def test_pause_files_go_to_each_consumers_own_metrics_folder_and_none_without_one():
    # as consumer_deployed finds them on a host: the folder each was deployed with, or none
    found = [{"name": "mail", "metrics_dir": "/srv/a"}, {"name": "sync", "metrics_dir": None},
             {"name": "thumbs", "metrics_dir": "/srv/b"}]
    paused = metrics_files(found, None, "batchq-", paused=True, only_paused=True)
    assert [entry["path"] for entry in paused] == ["/srv/a/batchq-mail.paused.prom", "/srv/b/batchq-thumbs.paused.prom"]
    assert all(entry["content"].endswith("} 1\n") for entry in paused)


def test_a_file_of_an_account_not_made_yet_needs_a_change_and_no_lookup_fails(tmp_path):
    # check mode on a fresh host: the role's account is made only when the play applies
    entry = {"path": str(tmp_path / "metrics.d"), "state": "directory", "owner": "no-such-user-here", "group": None,
             "mode": "0755"}
    assert consumer_files.needs_change(entry) is True
    (tmp_path / "metrics.d").mkdir()
    assert consumer_files.needs_change(entry) is True


def test_a_file_edited_to_other_line_ends_is_written_again(tmp_path):
    entry = {"path": str(tmp_path / "helper"), "state": "file", "content": "#!/bin/sh\ntrue\n", "force": True,
             "src": None, "owner": None, "group": None, "mode": "0755"}
    run([entry])
    (tmp_path / "helper").write_bytes(b"#!/bin/sh\r\ntrue\r\n")
    assert run([entry]) == [entry["path"]]
    assert (tmp_path / "helper").read_bytes() == b"#!/bin/sh\ntrue\n"
    assert run([entry]) == []
