#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ask a host, in one step, what the role needs to know before it changes anything."""

from __future__ import annotations

__metaclass__ = type

DOCUMENTATION = r"""
module: consumer_preflight
short_description: "Internal: ask a host what its consumers need, in one round trip, changing nothing"
description:
  - Internal. The collection's role and playbooks call it. It is not a public API and may change
    or go in any release without notice.
  - Used by the C(batchq.consumers.consumer) role before it changes a host. One call reads the
    host's systemd version, checks time spans with C(systemd-analyze timespan), looks up
    accounts by name, checks that paths exist and reads whether a run's credentials reach its
    unit, where a task for each would cost a round trip.
  - It only reads. The role decides on the controller what the answers mean.
  - Accounts are looked up by key with C(getent), never by listing a database, because directory
    services such as SSSD and LDAP answer for a name but usually do not list their users.
options:
  spans:
    description: Time spans to check; RV(rejected_spans) lists those systemd rejects.
    type: list
    elements: str
    default: []
  users:
    description: User names to look up in the passwd database.
    type: list
    elements: str
    default: []
  groups:
    description: Group names to look up in the group database.
    type: list
    elements: str
    default: []
  paths:
    description: Paths that must exist; RV(missing_paths) lists those that do not.
    type: list
    elements: path
    default: []
  first_lines:
    description:
      - Files whose first line RV(first_lines) gives, such as the scripts of preloaded consumers, whose
        C(#!) line names the Python the runner must run under.
    type: list
    elements: path
    default: []
  unit_dir:
    description: The folder of the unit files that RV(units) describes.
    type: path
    default: /etc/systemd/system
  unit_patterns:
    description:
      - Shell patterns of unit file names in O(unit_dir) whose content RV(units) gives as a digest, so
        that the controller sends, verifies and writes only the units that differ. RV(stale_units) names
        those that systemd has not loaded yet.
    type: list
    elements: str
    default: []
  metrics_dir:
    description:
      - The folder of the metrics files now (the role's C(consumer_metrics_dir)). A folder of
        RV(metrics_dirs) that is the same folder by another path (a link, a bind mount) is given as this one.
    type: path
  unit_states:
    description:
      - Units whose C(UnitFileState) and C(ActiveState) RV(unit_states) gives, such as the consumers'
        timers and their scheduled starts, so that the controller switches only the timers that are not
        as it wants them.
    type: list
    elements: str
    default: []
  stat:
    description:
      - Paths that RV(stat) describes, links not followed, so that the controller lays out only the
        files and folders that are not as it wants them.
    type: list
    elements: path
    default: []
  find:
    description:
      - Folders to list; RV(found) has the result. Like C(ansible.builtin.find) with C(file_type=any)
        and C(hidden=true), links are listed and never followed. The role lists its units and
        secrets, so that the controller works out what is no longer wanted before it changes anything.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description:
          - The folder; one that does not exist has nothing in it. One that cannot be read fails the
            module (the role's secrets folder needs root).
        type: path
        required: true
      patterns:
        description: Shell patterns a name must match (any of them).
        type: list
        elements: str
        default: ["*"]
      depth:
        description: How deep to look, C(1) for the folder's own entries, C(2) for those of its subfolders too.
        type: int
        default: 1
attributes:
  check_mode:
    support: full
    details: It changes nothing, and answers the same in check mode.
  diff_mode:
    support: none
  platform:
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
author:
  - batchq.consumers contributors (@batchq)
"""

EXAMPLES = r"""
- name: Ask the host
  batchq.consumers.consumer_preflight:
    spans: [5min, 1h]
    users: [batchq, www-data]
    groups: [batchq]
    paths: [/usr/local/bin/process_queue]
  register: answer

- name: Refuse a host without the command
  ansible.builtin.assert:
    that: answer.missing_paths == []
"""

RETURN = r"""
systemctl_version:
  description: What C(systemctl --version) printed.
  returned: always
  type: str
  sample: "systemd 252 (252.39-1~deb12u1)\n+PAM +AUDIT ..."
rejected_spans:
  description: The spans of O(spans) that C(systemd-analyze timespan) rejects, in their order.
  returned: always
  type: list
  elements: str
  sample: [1 fortnight]
users:
  description: The users of O(users) that exist, with their passwd fields; a missing one is not listed.
  returned: always
  type: dict
  sample: {batchq: {uid: 998, gid: 998, home: /var/lib/batchq, shell: /usr/sbin/nologin}}
groups:
  description: The groups of O(groups) that exist, with their ID; a missing one is not listed.
  returned: always
  type: dict
  sample: {batchq: 998}
found:
  description: For each folder of O(find), the paths below it whose names match, sorted.
  returned: always
  type: dict
  sample: {/etc/systemd/system: [/etc/systemd/system/batchq-thumbs.service, /etc/systemd/system/batchq-thumbs.timer]}
units:
  description: The SHA-256 of each regular file in O(unit_dir) whose name matches O(unit_patterns).
  returned: always
  type: dict
  sample: {batchq-thumbs.service: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}
first_lines:
  description:
    - The first line of each file of O(first_lines), without its newline, at most 512 bytes of it
      (undecodable bytes escaped); V(null) for a file that cannot be read.
  returned: always
  type: dict
  sample: {/usr/local/bin/batchq-pgqueue: "#!/usr/bin/python3"}
credentials_shared:
  description:
    - Whether the mount that holds C(/run/credentials), in systemd's own mount namespace, is shared.
      systemd mounts a run's credentials there. Only a shared mount passes them on to a unit with a
      mount namespace of its own (every consumer has one) that does not run as root.
    - systemd makes every mount shared at boot on a host. A systemd container (docker, podman) keeps
      the private mounts the engine gave it, and then a consumer that is not root cannot read its
      credentials.
  returned: always
  type: bool
  sample: true
stale_units:
  description:
    - The unit files of RV(units) that systemd has not loaded since they changed (C(NeedDaemonReload=yes);
      for a template, of one of its loaded instances), sorted.
  returned: always
  type: list
  elements: str
  sample: [batchq-thumbs.timer]
unit_states:
  description:
    - For each unit of O(unit_states), its C(UnitFileState) and C(ActiveState) as systemd reports them.
      A unit systemd does not know is C(inactive) with an empty C(UnitFileState).
  returned: always
  type: dict
  sample: {batchq-thumbs.timer: {UnitFileState: enabled, ActiveState: active}}
stat:
  description:
    - For each path of O(stat), what is there, or V(null) when nothing is. A link gives its C(target);
      a folder or a regular file its C(uid), C(gid) and C(mode) (the permission bits, as a number);
      a regular file also the C(sha256) of its content. Anything else is of C(type) V(other).
  returned: always
  type: dict
  sample: {/usr/local/lib/batchq: {type: directory, uid: 0, gid: 0, mode: 493}}
metrics_dirs:
  description:
    - For each timer file of RV(units), the folder of the consumer's metrics files that the role's
      record in it names (C(Metrics=) of its C([X-Batchq]) section), or V(null) when it names none
      (metrics off, or a file written before the record). A deploy that moves or turns off the metrics
      removes the files from that folder. One that is O(metrics_dir) by another path is given as O(metrics_dir).
  returned: always
  type: dict
  sample: {batchq-thumbs.timer: /var/lib/prometheus/node-exporter}
missing_paths:
  description: The paths of O(paths) that do not exist, in their order.
  returned: always
  type: list
  elements: str
  sample: [/usr/local/bin/process_queue]
"""

import errno
import fnmatch
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_deployed import timer_settings
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_layout import describe, sha256
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_unit_states import LANG_C, stale_units, unit_states


def parse_getent(out, database):
    """{name: fields} of getent's lines: passwd gives uid, gid, home and shell; group its gid."""
    found = {}
    for line in out.splitlines():
        fields = line.split(":")
        if database == "passwd" and len(fields) >= 7:
            found[fields[0]] = {"uid": int(fields[2]), "gid": int(fields[3]), "home": fields[5], "shell": fields[6]}
        elif database == "group" and len(fields) >= 3:
            found[fields[0]] = int(fields[2])
    return found


def lookup(module, database, names):
    if not names:
        return {}
    rc, out, err = module.run_command([module.get_bin_path("getent", required=True), database, "--"] + names,
                                      environ_update=LANG_C)
    if rc not in (0, 2):  # 2: at least one name is not found
        module.fail_json(msg="getent %s failed: %s" % (database, err.strip()), rc=rc)
    return parse_getent(out, database)


def unit_files(folder, patterns):
    """({name: SHA-256 of the content}, {name: metrics folder of the role's
    record, or None} of the timers) of the regular files in folder matching patterns."""
    digests, metrics_dirs = {}, {}
    if not patterns or not os.path.isdir(folder):
        return digests, metrics_dirs
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if any(fnmatch.fnmatch(name, p) for p in patterns) and os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as handle:
                content = handle.read()
            digests[name] = sha256(content)
            if name.endswith(".timer"):
                metrics_dirs[name] = timer_settings(content.decode("utf-8", "replace"))["metrics_dir"]
    return digests, metrics_dirs


def as_metrics_dir(folder, metrics_dir):
    """folder, or metrics_dir when both name one folder: the plan compares the
    paths, and must not take the folder of the metrics now for another."""
    try:
        return metrics_dir if folder and metrics_dir and os.path.samefile(folder, metrics_dir) else folder
    except OSError:  # either is missing: not one folder
        return folder


def _missing_is_empty(error):
    """os.walk's onerror: a folder that does not exist has nothing in it; one
    that cannot be read must not look empty, or the plan would keep what it lists."""
    if error.errno != errno.ENOENT:
        raise error


def find(folder, patterns, depth):
    """The paths below folder, depth levels deep, whose names match one of
    patterns; links are listed, never followed."""
    found = []
    for root, folders, files in os.walk(folder, onerror=_missing_is_empty):
        level = root[len(folder):].count(os.sep) + 1
        names = folders + files
        found += [os.path.join(root, name) for name in names if any(fnmatch.fnmatch(name, p) for p in patterns)]
        if level >= depth:
            folders[:] = []
    return sorted(found)


def first_line(path):
    """A file's first line, at most 512 bytes of it, or None if it cannot be read."""
    try:
        with open(path, "rb") as handle:
            line = handle.readline(512)
    except OSError:
        return None
    return line.rstrip(b"\r\n").decode("utf-8", "backslashreplace")


def _unescape(field):
    """A mountinfo field as the path it names (spaces and the like come octal-escaped)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def is_shared(mountinfo, path):
    """Whether the mount that holds path is shared, by the text of a
    /proc/PID/mountinfo. Of mounts stacked on one point the last one listed
    is the one on top. Optional fields, such as shared:N, stand between the
    mount options and the " - " separator (proc(5))."""
    holder, shared = "", False
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        point = _unescape(fields[4])
        inside = point == "/" or path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(holder):
            holder = point
            shared = any(field.startswith("shared:") for field in fields[6:fields.index("-", 6)])
    return shared


def read_mountinfo():
    """systemd's mount table (PID 1's), where it mounts the credentials; this
    process's where that cannot be read."""
    for path in ("/proc/1/mountinfo", "/proc/self/mountinfo"):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except OSError:
            continue
    return ""


def main():
    module = AnsibleModule(
        argument_spec={
            "spans": {"type": "list", "elements": "str", "default": []},
            "users": {"type": "list", "elements": "str", "default": []},
            "groups": {"type": "list", "elements": "str", "default": []},
            "paths": {"type": "list", "elements": "path", "default": []},
            "first_lines": {"type": "list", "elements": "path", "default": []},
            "unit_dir": {"type": "path", "default": "/etc/systemd/system"},
            "unit_patterns": {"type": "list", "elements": "str", "default": []},
            "metrics_dir": {"type": "path"},
            "unit_states": {"type": "list", "elements": "str", "default": []},
            "stat": {"type": "list", "elements": "path", "default": []},
            "find": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "path", "required": True},
                "patterns": {"type": "list", "elements": "str", "default": ["*"]},
                "depth": {"type": "int", "default": 1},
            }},
        },
        supports_check_mode=True,
    )
    try:
        found = {entry["path"]: find(entry["path"], entry["patterns"], entry["depth"]) for entry in module.params["find"]}
    except OSError as exc:
        module.fail_json(msg="cannot list %s: %s" % (exc.filename, exc.strerror))
    rc, version, err = module.run_command([module.get_bin_path("systemctl", required=True), "--version"],
                                          environ_update=LANG_C)
    if rc != 0:
        module.fail_json(msg="systemctl --version failed: %s" % err.strip(), rc=rc)
    # One call per span: systemd-analyze stops at the first span it rejects.
    analyze = module.get_bin_path("systemd-analyze", required=bool(module.params["spans"]))
    rejected = [span for span in dict.fromkeys(module.params["spans"])
                if module.run_command([analyze, "timespan", "--", span], environ_update=LANG_C)[0] != 0]
    units, metrics_dirs = unit_files(module.params["unit_dir"], module.params["unit_patterns"])
    module.exit_json(
        changed=False,
        systemctl_version=version,
        rejected_spans=rejected,
        users=lookup(module, "passwd", list(dict.fromkeys(module.params["users"]))),
        groups=lookup(module, "group", list(dict.fromkeys(module.params["groups"]))),
        first_lines={path: first_line(path) for path in module.params["first_lines"]},
        missing_paths=[path for path in module.params["paths"] if not os.path.exists(path)],
        credentials_shared=is_shared(read_mountinfo(), "/run/credentials"),
        units=units,
        stale_units=stale_units(module, sorted(units)),
        unit_states={unit: {"UnitFileState": shown[0], "ActiveState": shown[1]}
                     for unit, shown in unit_states(module, list(dict.fromkeys(module.params["unit_states"]))).items()},
        stat={path: describe(path) for path in module.params["stat"]},
        found=found,
        metrics_dirs={timer: as_metrics_dir(folder, module.params["metrics_dir"]) for timer, folder in metrics_dirs.items()},
    )


if __name__ == "__main__":
    main()
