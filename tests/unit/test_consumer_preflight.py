"""consumer_preflight's pure parts: getent's lines, the digests of unit files, the listing of folders
(as ansible.builtin.find lists them) and the mount table."""

import hashlib
import pathlib

import pytest

from ansible_collections.batchq.consumers.plugins.modules import consumer_preflight

# getent passwd batchq www-data nobody-here; getent group batchq (Debian 12)
PASSWD = "batchq:x:998:998::/var/lib/batchq:/usr/sbin/nologin\nwww-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\n"
GROUP = "batchq:x:998:\n"
FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def test_getent_lines_give_each_found_account_its_fields():
    assert consumer_preflight.parse_getent(PASSWD, "passwd") == {
        "batchq": {"uid": 998, "gid": 998, "home": "/var/lib/batchq", "shell": "/usr/sbin/nologin"},
        "www-data": {"uid": 33, "gid": 33, "home": "/var/www", "shell": "/usr/sbin/nologin"}}
    assert consumer_preflight.parse_getent(GROUP, "group") == {"batchq": 998}
    assert consumer_preflight.parse_getent("", "passwd") == {}


def test_unit_files_are_the_matching_regular_files_only(tmp_path):
    (tmp_path / "batchq-a.service").write_text("[Service]\n")
    (tmp_path / "batchq.continue@.service").write_text("[Unit]\n")
    (tmp_path / "other.service").write_text("x")
    (tmp_path / "batchq-a.service.d").mkdir()
    (tmp_path / "batchq-link.timer").symlink_to(tmp_path / "other.service")
    digests, metrics_dirs = consumer_preflight.unit_files(str(tmp_path), ["batchq-*", "batchq.continue@.service"])
    assert digests == {"batchq-a.service": hashlib.sha256(b"[Service]\n").hexdigest(),
                       "batchq.continue@.service": hashlib.sha256(b"[Unit]\n").hexdigest()}
    assert metrics_dirs == {}
    assert consumer_preflight.unit_files(str(tmp_path / "none"), ["*"]) == ({}, {})


def test_the_metrics_folder_of_each_timer_comes_from_the_roles_record(tmp_path):
    (tmp_path / "batchq-a.timer").write_text("[Timer]\nOnBootSec=1s\n\n[X-Batchq]\nInstances=1\nMetrics=/srv/metrics\n")
    (tmp_path / "batchq-b@.timer").write_text("[Timer]\n\n[X-Batchq]\nInstances=2\nState=present\n")
    (tmp_path / "batchq-c.timer").write_text("[Timer]\n")
    (tmp_path / "batchq-a.service").write_text("[Service]\n# Metrics=/nowhere\n")
    assert consumer_preflight.unit_files(str(tmp_path), ["batchq-*"])[1] == {
        "batchq-a.timer": "/srv/metrics", "batchq-b@.timer": None, "batchq-c.timer": None}


def test_first_line_is_the_line_without_its_newline_or_none(tmp_path):
    (tmp_path / "script").write_bytes(b"#!/usr/bin/python3\r\nimport os\n")
    (tmp_path / "binary").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 2000)
    (tmp_path / "empty").write_bytes(b"")
    assert consumer_preflight.first_line(str(tmp_path / "script")) == "#!/usr/bin/python3"
    assert consumer_preflight.first_line(str(tmp_path / "binary")).startswith("\x7fELF")
    assert len(consumer_preflight.first_line(str(tmp_path / "binary"))) == 512
    assert consumer_preflight.first_line(str(tmp_path / "empty")) == ""
    assert consumer_preflight.first_line(str(tmp_path / "missing")) is None


# /proc/1/mountinfo of a Debian 12 container of the tests' bare image (docker,
# /run a tmpfs of the engine's): as it boots (shared-mounts.service shares /run,
# as systemd does on a host), then after `mount --make-private /run`.
SHARED = (FIXTURES / "bookworm" / "mountinfo-run-shared.txt").read_text()
PRIVATE = (FIXTURES / "bookworm" / "mountinfo-run-private.txt").read_text()


def test_credentials_reach_units_where_the_mount_that_holds_them_is_shared():
    assert consumer_preflight.is_shared(SHARED, "/run/credentials")
    # each run's own credentials mount below it changes nothing
    assert not consumer_preflight.is_shared(PRIVATE, "/run/credentials")
    assert "/run/credentials/systemd-sysusers.service" in PRIVATE and " shared:4 " in PRIVATE


def test_without_a_mount_of_its_own_run_is_as_shared_as_the_root():
    without_run = "\n".join(line for line in PRIVATE.splitlines() if " /run " not in line)
    assert not consumer_preflight.is_shared(without_run, "/run/credentials")
    root_shared = without_run.replace(" / / rw,relatime - ", " / / rw,relatime shared:1 - ")
    assert consumer_preflight.is_shared(root_shared, "/run/credentials")
    # a private mount whose name only starts like the path does not hold it
    assert consumer_preflight.is_shared(root_shared.replace("/run/lock rw", "/run/credentialsX rw"), "/run/credentials/x")


def test_of_mounts_stacked_on_one_point_the_last_listed_is_on_top():
    on_top = PRIVATE + "140 84 0:61 / /run rw,nosuid,nodev shared:9 - tmpfs tmpfs rw\n"
    assert consumer_preflight.is_shared(on_top, "/run/credentials")
    assert not consumer_preflight.is_shared(on_top + PRIVATE.splitlines()[0] + "\n" + next(
        line for line in PRIVATE.splitlines() if " /run " in line) + "\n", "/run/credentials")


def test_a_mount_point_with_a_space_is_read_unescaped():
    line = "150 77 0:62 / /srv/with\\040space rw shared:7 - tmpfs tmpfs rw\n"
    assert consumer_preflight.is_shared(PRIVATE + line, "/srv/with space/x")
    assert not consumer_preflight.is_shared(PRIVATE + line, "/srv/with")


def test_find_lists_matching_names_to_the_depth_asked_without_following_links(tmp_path):
    units = tmp_path / "system"
    (units / "timers.target.wants").mkdir(parents=True)
    (units / "batchq-a.service.d").mkdir()
    (units / "batchq-a.service.d" / "override.conf").write_text("")
    (units / "batchq-a.service").write_text("")
    (units / "sshd.service").write_text("")
    (units / "timers.target.wants" / "batchq-a.timer").symlink_to(units / "batchq-a.service")
    (units / "timers.target.wants" / "deeper").mkdir()
    (units / "timers.target.wants" / "deeper" / "batchq-b.timer").write_text("")
    found = consumer_preflight.find(str(units), ["batchq-*"], 2)
    assert found == [str(units / "batchq-a.service"), str(units / "batchq-a.service.d"),
                     str(units / "timers.target.wants" / "batchq-a.timer")]
    shallow = [str(units / "batchq-a.service"), str(units / "batchq-a.service.d")]
    assert consumer_preflight.find(str(units), ["batchq-*"], 1) == shallow
    assert consumer_preflight.find(str(tmp_path / "none"), ["*"], 1) == []


def test_find_fails_on_a_folder_it_cannot_list_rather_than_find_it_empty(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    with pytest.raises(NotADirectoryError):
        consumer_preflight.find(str(not_a_folder), ["*"], 1)


def test_a_recorded_metrics_folder_that_is_the_one_now_by_a_link_is_given_as_that_one(tmp_path):
    (tmp_path / "now").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "now")
    now = str(tmp_path / "now")
    assert consumer_preflight.as_metrics_dir(str(tmp_path / "link"), now) == now
    assert consumer_preflight.as_metrics_dir(str(tmp_path / "other"), now) == str(tmp_path / "other")
    assert consumer_preflight.as_metrics_dir(str(tmp_path / "gone"), now) == str(tmp_path / "gone")
    assert consumer_preflight.as_metrics_dir(None, now) is None
    assert consumer_preflight.as_metrics_dir(str(tmp_path / "other"), None) == str(tmp_path / "other")
