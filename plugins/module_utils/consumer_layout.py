# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a file, folder or link on a host is as an entry of the
consumer_files module wants it, decided once for both sides.

The consumer_preflight module describes each path (describe()) and the
planner on the controller compares (differs()): a deploy that changes nothing
sends no file to lay out, and skips that module run. The consumer_files
module makes the same comparison on the host before it changes a path.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat

__metaclass__ = type

_WHO = {"u": 0o700, "g": 0o070, "o": 0o007, "a": 0o777}
_WHAT = {"r": 0o444, "w": 0o222, "x": 0o111}


def wanted_mode(mode, current):
    """The permissions mode asks for a file that has current: octal ("0644")
    replaces them, "WHO+WHAT" ("a+rx") adds rights; None leaves them."""
    if not mode:
        return current
    match = re.match(r"^([ugoa]+)\+([rwx]+)$", mode)
    if match:
        who = sum(_WHO[c] for c in set(match.group(1)))
        what = sum(_WHAT[c] for c in set(match.group(2)))
        return current | (who & what)
    try:
        return int(mode, 8)
    except ValueError:
        raise ValueError("mode %r is neither octal nor like a+rx" % mode) from None


def sha256(data):
    """The SHA-256 of bytes, or of a text as UTF-8."""
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


def _file_digest(path):
    """The SHA-256 of a regular file's content, or None. Opened without
    following a link and without blocking, then checked to be a regular file:
    a consumer that can write the folder could swap in a link or a FIFO."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        return sha256(handle.read())


def describe(path):
    """What is at path, without following a link: None when nothing is;
    {"type": "link", "target"}; {"type": "directory" or "file", "uid", "gid",
    "mode"}, with a file's "sha256" (None when it cannot be read); or
    {"type": "other"}."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(info.st_mode):
        return {"type": "link", "target": os.readlink(path)}
    kind = "directory" if stat.S_ISDIR(info.st_mode) else "file" if stat.S_ISREG(info.st_mode) else "other"
    if kind == "other":
        return {"type": kind}
    found = {"type": kind, "uid": info.st_uid, "gid": info.st_gid, "mode": stat.S_IMODE(info.st_mode)}
    if kind == "file":
        found["sha256"] = _file_digest(path)  # None differs from any content
    return found


def attributes_differ(found, entry, ids):
    uid, gid = ids
    return ((uid != -1 and found["uid"] != uid) or (gid != -1 and found["gid"] != gid)
            or wanted_mode(entry.get("mode"), found["mode"]) != found["mode"])


def differs(entry, found, ids, content_sha256=None):
    """Whether the path of entry (a consumer_files entry) differs from found
    (describe() of it). ids: the (uid, gid) the entry's owner and group have,
    -1 for what it leaves alone, None when the host has no such account yet.
    content_sha256: the digest of the entry's content, when the caller has it
    but not the content."""
    state = entry.get("state", "file")
    if state == "absent":
        return found is not None
    if state == "link":
        return found is None or found["type"] != "link" or found["target"] != entry["src"]
    if found is None:
        return True
    if state == "directory":
        return found["type"] != "directory" or ids is None or attributes_differ(found, entry, ids)
    if found["type"] != "file":
        return True
    if not entry.get("force", True):
        return False  # someone else's from now on (the metrics writers replace it as root or as the consumer)
    if ids is None:
        return True
    wanted = content_sha256 if content_sha256 is not None else sha256(entry.get("content", ""))
    return found["sha256"] != wanted or attributes_differ(found, entry, ids)
