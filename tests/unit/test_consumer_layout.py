"""What consumer_preflight reports of a path (describe()) and how the planner
compares it with what consumer_files would lay out (differs()), on real files."""

import os

import pytest

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_layout import describe, differs, sha256

ME = (os.getuid(), os.getgid())


def test_each_kind_of_path_is_described_without_following_links(tmp_path):
    (tmp_path / "file").write_text("text\n")
    os.chmod(tmp_path / "file", 0o640)
    (tmp_path / "folder").mkdir(mode=0o750)
    os.chmod(tmp_path / "folder", 0o750)
    os.symlink("file", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    assert describe(str(tmp_path / "file")) == {"type": "file", "uid": ME[0], "gid": ME[1], "mode": 0o640,
                                                "sha256": sha256("text\n")}
    assert describe(str(tmp_path / "folder")) == {"type": "directory", "uid": ME[0], "gid": ME[1], "mode": 0o750}
    assert describe(str(tmp_path / "link")) == {"type": "link", "target": "file"}
    assert describe(str(tmp_path / "fifo")) == {"type": "other"}
    assert describe(str(tmp_path / "missing")) is None
    assert describe(str(tmp_path / "file" / "below")) is None  # a file is no folder


FILE = {"path": "/x", "state": "file", "content": "text\n", "mode": "0644"}
FOUND = {"type": "file", "uid": 0, "gid": 0, "mode": 0o644, "sha256": sha256("text\n")}


@pytest.mark.parametrize("entry, found, ids, expected", [
    (FILE, FOUND, (-1, -1), False),
    (FILE, dict(FOUND, sha256=sha256("old\n")), (-1, -1), True),
    (FILE, dict(FOUND, mode=0o600), (-1, -1), True),
    (dict(FILE, owner="app"), FOUND, (998, -1), True),
    (dict(FILE, owner="app"), FOUND, None, True),  # the account is made by this deploy
    (dict(FILE, owner="app", force=False), FOUND, None, False),  # someone else's once it exists
    (FILE, None, (-1, -1), True),
    (FILE, {"type": "link", "target": "/y"}, (-1, -1), True),
    # someone else's once it exists (the metrics writers replace it)
    (dict(FILE, force=False), dict(FOUND, sha256=sha256("counters\n"), mode=0o600), (-1, -1), False),
    ({"path": "/d", "state": "directory", "mode": "a+rx"}, dict(FOUND, type="directory", mode=0o755), (-1, -1), False),
    ({"path": "/d", "state": "directory", "mode": "a+rx"}, dict(FOUND, type="directory", mode=0o750), (-1, -1), True),
    ({"path": "/d", "state": "directory"}, FOUND, (-1, -1), True),
    ({"path": "/l", "state": "link", "src": "a"}, {"type": "link", "target": "a"}, None, False),
    ({"path": "/l", "state": "link", "src": "a"}, {"type": "link", "target": "b"}, None, True),
    ({"path": "/gone", "state": "absent"}, None, None, False),
    ({"path": "/gone", "state": "absent"}, {"type": "other"}, None, True),
])
def test_an_entry_differs_only_where_the_host_is_not_as_it_wants(entry, found, ids, expected):
    assert differs(entry, found, ids) is expected


def test_a_helper_is_compared_by_the_digest_of_its_source():
    helper = {"path": "/usr/local/lib/batchq/batchq-drain", "mode": "0755"}
    found = dict(FOUND, mode=0o755, sha256=sha256("runner\n"))
    assert differs(helper, found, (-1, -1), content_sha256=sha256("runner\n")) is False
    assert differs(helper, found, (-1, -1), content_sha256=sha256("newer runner\n")) is True
