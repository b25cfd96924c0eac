"""consumer_preflight's pure parts: getent's lines and the digests of unit files."""

import hashlib

from ansible_collections.batchq.consumers.plugins.modules import consumer_preflight

# getent passwd batchq www-data nobody-here; getent group batchq (Debian 12)
PASSWD = "batchq:x:998:998::/var/lib/batchq:/usr/sbin/nologin\nwww-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\n"
GROUP = "batchq:x:998:\n"


def test_getent_lines_give_each_found_account_its_fields():
    assert consumer_preflight.parse_getent(PASSWD, "passwd") == {
        "batchq": {"uid": 998, "gid": 998, "home": "/var/lib/batchq", "shell": "/usr/sbin/nologin"},
        "www-data": {"uid": 33, "gid": 33, "home": "/var/www", "shell": "/usr/sbin/nologin"}}
    assert consumer_preflight.parse_getent(GROUP, "group") == {"batchq": 998}
    assert consumer_preflight.parse_getent("", "passwd") == {}


def test_unit_digests_are_of_matching_regular_files_only(tmp_path):
    (tmp_path / "batchq-a.service").write_text("[Service]\n")
    (tmp_path / "batchq.continue@.service").write_text("[Unit]\n")
    (tmp_path / "other.service").write_text("x")
    (tmp_path / "batchq-a.service.d").mkdir()
    (tmp_path / "batchq-link.timer").symlink_to(tmp_path / "other.service")
    digests = consumer_preflight.unit_digests(str(tmp_path), ["batchq-*", "batchq.continue@.service"])
    assert digests == {"batchq-a.service": hashlib.sha256(b"[Service]\n").hexdigest(),
                       "batchq.continue@.service": hashlib.sha256(b"[Unit]\n").hexdigest()}
    assert consumer_preflight.unit_digests(str(tmp_path / "none"), ["*"]) == {}


def test_first_line_is_the_line_without_its_newline_or_none(tmp_path):
    (tmp_path / "script").write_bytes(b"#!/usr/bin/python3\r\nimport os\n")
    (tmp_path / "binary").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 2000)
    (tmp_path / "empty").write_bytes(b"")
    assert consumer_preflight.first_line(str(tmp_path / "script")) == "#!/usr/bin/python3"
    assert consumer_preflight.first_line(str(tmp_path / "binary")).startswith("\x7fELF")
    assert len(consumer_preflight.first_line(str(tmp_path / "binary"))) == 512
    assert consumer_preflight.first_line(str(tmp_path / "empty")) == ""
    assert consumer_preflight.first_line(str(tmp_path / "missing")) is None
