#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lay out many small files, folders and links in one step."""

from __future__ import annotations

__metaclass__ = type

DOCUMENTATION = r"""
module: consumer_files
short_description: "Internal: lay out many small files, folders and links in one step"
description:
  - Internal. The collection's role and playbooks call it. It is not a public API and may change
    or go in any release without notice.
  - Used by the C(batchq.consumers.consumer) role and the C(consumer_control) playbook for the
    consumers' helpers, secret environment files, credentials and metrics files (see the
    C(batchq.consumers.consumer_metrics_files) filter). One call does what a loop of
    C(ansible.builtin.file) and C(ansible.builtin.copy) tasks would do with several round trips
    to the host for every consumer.
  - Each entry is brought to its state in order; only what differs is changed. A file's content
    is replaced atomically (a temporary file in the same folder, then a rename).
  - The missing folders above an entry, a secret file or a credential are made first, root's with
    mode C(0755), as a package would make them. They are in RV(changed_paths) too.
options:
  absent:
    description: Paths to remove first (a folder goes with everything in it); a missing one is fine.
    type: list
    elements: path
    default: []
  unused:
    description:
      - Paths to remove after O(absent) and O(files) when no file in O(named_in) names them any more
        (for the role, the drain runner, the after-run helpers and C(batchq.continue@.service), once the
        last unit that uses them is gone, whatever its prefix). A folder goes with everything in it.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      named_by:
        description: The strings a file that still uses O(unused[].path) holds; the path stays while one does.
        type: list
        elements: str
        required: true
  named_in:
    description: The folder whose files (not its subfolders) O(unused) looks in, e.g. C(/etc/systemd/system).
    type: path
    default: /etc/systemd/system
  files:
    description: What to lay out, in this order, after O(absent).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      state:
        description:
          - V(directory), V(file) (with O(files[].content)), V(link) (to O(files[].src)) or
            V(absent) (a folder goes with everything in it).
        type: str
        choices: [directory, file, link, absent]
        default: file
      content:
        description: The content of a V(file).
        type: str
        default: ""
      force:
        description:
          - Replace the content of an existing V(file) that differs; V(false) only creates a missing
            one, and leaves an existing one alone, its owner and mode too.
        type: bool
        default: true
      src:
        description: Where a V(link) points, as written into the link.
        type: str
      owner:
        description: Owner of a V(directory) or V(file); default the one the module runs as.
        type: str
      group:
        description: Group of a V(directory) or V(file); default the owner's.
        type: str
      mode:
        description:
          - Permissions of a V(directory) or V(file), octal (V("0644")), or rights to add to those it
            has (V(a+rx), V(u+w)), which never takes a right away from a folder others share. A new
            folder starts from the umask's rights, a new file from C(0600).
        type: str
  secret_files:
    description:
      - Files to write after O(files), path to content, each owned by root with mode C(0600); their
        content is never logged, returned or shown in a diff. Put their folder in O(files) to give it an owner
        and mode of its own.
    type: dict
    default: {}
  credentials:
    description:
      - systemd credentials to write after O(secret_files), each owned by root with mode C(0600),
        encrypted with C(systemd-creds encrypt) when O(encrypt_credentials) is set, the value itself
        otherwise. Their values are never logged, returned or shown in a diff.
      - An encrypted credential is decrypted (C(systemd-creds decrypt)) to tell whether its value
        changed; the same value is not encrypted again, so a deploy that changes nothing changes no
        credential file.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the credential's file.
        type: path
        required: true
      name:
        description: The credential's name, which an encrypted file is bound to (C(--name=)).
        type: str
        required: true
      value:
        description: The secret value.
        type: str
        required: true
  encrypt_credentials:
    description:
      - Encrypt O(credentials) with C(systemd-creds) (systemd 250 and later) for C(LoadCredentialEncrypted=),
        with the host's key (and a TPM2 where there is one, systemd's C(auto)).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: partial
    details: The content of a V(file) of O(files) that changes, never that of O(secret_files) or O(credentials).
  platform:
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
author:
  - batchq.consumers contributors (@batchq)
"""

EXAMPLES = r"""
- name: Lay out the consumers' metrics files
  batchq.consumers.consumer_files:
    files: "{{ consumers | batchq.consumers.consumer_metrics_files('/var/lib/prometheus/node-exporter', 'batchq-') }}"
"""

RETURN = r"""
changed_paths:
  description: The paths that were changed (or would be, in check mode), in order.
  returned: always
  type: list
  elements: str
  sample: [/var/lib/prometheus/node-exporter/batchq-mail.paused.prom]
"""

import grp
import os
import pwd
import shutil
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_layout import (
    attributes_differ,
    describe,
    differs,
    wanted_mode,
)


def _ids(entry):
    """(uid, gid) the entry asks for; -1 for what it leaves alone."""
    uid = pwd.getpwnam(entry["owner"]).pw_uid if entry.get("owner") else -1
    gid = grp.getgrnam(entry["group"]).gr_gid if entry.get("group") else -1
    return uid, gid


def _attributes_differ(path, entry):
    info = os.lstat(path)
    return attributes_differ({"uid": info.st_uid, "gid": info.st_gid, "mode": stat.S_IMODE(info.st_mode)},
                             entry, _ids(entry))


def _set_attributes(descriptor, entry):
    """Owner and mode on an open file: never on a path, which a consumer that
    can write the folder could have swapped for a link to any file."""
    uid, gid = _ids(entry)
    if uid != -1 or gid != -1:
        os.fchown(descriptor, uid, gid)
    if entry.get("mode"):
        os.fchmod(descriptor, wanted_mode(entry["mode"], stat.S_IMODE(os.fstat(descriptor).st_mode)))


def _open_own(path, directory=False):
    """path opened without following a link: it must be the file itself."""
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0))


def _content(path):
    try:
        with os.fdopen(_open_own(path), encoding="utf-8") as handle:
            return handle.read()
    except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError, OSError):
        return None


def missing_parents(path):
    """The folders above path that do not exist yet, the topmost first. A bare
    host has no /var/lib/prometheus, for one: the role makes what it writes into."""
    missing = []
    parent = os.path.dirname(path)
    while parent not in ("", "/") and not os.path.lexists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    return missing[::-1]


def make_parents(parents):
    """Each folder of parents (missing_parents()), root's with mode 0755, as
    a package would make it, whatever the umask."""
    for parent in parents:
        os.mkdir(parent, 0o755)
        descriptor = _open_own(parent, directory=True)
        try:
            os.fchmod(descriptor, 0o755)
        finally:
            os.close(descriptor)


def needs_change(entry):
    """Whether the entry differs from what is on the host (the planner asks
    the same of consumer_preflight's description of the path). An owner that
    does not exist yet (check mode on a fresh host) means it does."""
    try:
        ids = _ids(entry)
    except KeyError:
        ids = None
    return differs(entry, describe(entry["path"]), ids)


def apply(entry):
    """Bring the entry to its state (needs_change() said it differs)."""
    path, state = entry["path"], entry["state"]
    if state != "directory" and os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    if state == "absent":
        if os.path.lexists(path):
            os.unlink(path)
    elif state == "link":
        # a new link renamed over the old one: never a moment without it
        temporary = "%s.%d.tmp" % (path, os.getpid())
        os.symlink(entry["src"], temporary)
        os.rename(temporary, path)
    elif state == "directory":
        if os.path.islink(path):
            os.unlink(path)
        if not os.path.isdir(path):
            os.mkdir(path)
        descriptor = _open_own(path, directory=True)
        try:
            _set_attributes(descriptor, entry)
        finally:
            os.close(descriptor)
    else:
        if os.path.islink(path):
            os.unlink(path)
        # bytes, as needs_change() compared them: text would read "\r\n" as "\n"
        if not os.path.isfile(path) or (entry["force"] and _bytes_of(path) != entry["content"].encode("utf-8")):
            handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".batchq.")
            with os.fdopen(handle, "w", encoding="utf-8") as output:
                output.write(entry["content"])
                # owner and mode as asked before it is in place (mkstemp makes it 0600)
                _set_attributes(output.fileno(), dict(entry, mode=entry.get("mode") or "0644"))
            os.rename(temporary, path)
        else:  # the content is right, owner or mode not
            descriptor = _open_own(path)
            try:
                _set_attributes(descriptor, entry)
            finally:
                os.close(descriptor)


ROOT_ONLY = {"owner": "root", "group": "root", "mode": "0600"}


def _bytes_of(path):
    try:
        with os.fdopen(_open_own(path), "rb") as handle:
            return handle.read()
    except OSError:
        return None


def credential_differs(module, credential, encrypt):
    """Whether the credential's file is missing, not root's alone, or holds another value."""
    path = credential["path"]
    if not os.path.isfile(path) or os.path.islink(path) or _attributes_differ(path, ROOT_ONLY):
        return True
    if not encrypt:
        return _bytes_of(path) != credential["value"].encode("utf-8")
    rc, out, _err = module.run_command(
        [module.get_bin_path("systemd-creds", required=True), "decrypt", "--name=" + credential["name"], path, "-"],
        binary_data=True, encoding=None)
    return rc != 0 or out != credential["value"].encode("utf-8")


def write_credential(module, credential, encrypt):
    """The credential's file replaced atomically, root's alone before it is in place."""
    data = credential["value"].encode("utf-8")
    if encrypt:
        rc, data, err = module.run_command(
            [module.get_bin_path("systemd-creds", required=True), "encrypt", "--name=" + credential["name"], "-", "-"],
            data=data, binary_data=True, encoding=None)
        if rc != 0:
            raise OSError("systemd-creds encrypt failed: %s" % err.decode("utf-8", "replace").strip())
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(credential["path"]), prefix=".batchq.")
    try:
        with os.fdopen(handle, "wb") as output:
            _set_attributes(output.fileno(), ROOT_ONLY)
            output.write(data)
        os.rename(temporary, credential["path"])
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def unused_paths(entries, folder, gone=()):
    """The paths of entries that no file of folder names, other than the path
    itself and those in gone (removed, or to be in check mode)."""
    texts = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        if path not in gone and os.path.isfile(path) and not os.path.islink(path):
            texts[path] = _content(path) or ""
    return [entry["path"] for entry in entries if os.path.lexists(entry["path"]) and not any(
        needle in text for path, text in texts.items() if path != entry["path"] for needle in entry["named_by"])]


def main():
    module = AnsibleModule(
        argument_spec={
            "absent": {"type": "list", "elements": "path", "default": []},
            "files": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "path", "required": True},
                "state": {"type": "str", "choices": ["directory", "file", "link", "absent"], "default": "file"},
                "content": {"type": "str", "default": ""},
                "force": {"type": "bool", "default": True},
                "src": {"type": "str"},
                "owner": {"type": "str"},
                "group": {"type": "str"},
                "mode": {"type": "str"},
            }},
            "unused": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "path", "required": True},
                "named_by": {"type": "list", "elements": "str", "required": True},
            }},
            "named_in": {"type": "path", "default": "/etc/systemd/system"},
            "secret_files": {"type": "dict", "default": {}, "no_log": True},
            # no_log on the values alone: the paths come back in changed_paths, which
            # tells the role which drains to end (a no_log path would be masked there)
            "credentials": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "path", "required": True},
                "name": {"type": "str", "required": True},
                "value": {"type": "str", "required": True, "no_log": True},
            }},
            "encrypt_credentials": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    changed, diffs = [], []
    gone = [{"path": path, "state": "absent"} for path in module.params["absent"]]
    secrets = [{"path": path, "state": "file", "content": content, "force": True, "owner": "root", "group": "root",
                "mode": "0600", "secret": True} for path, content in sorted(module.params["secret_files"].items())]

    def lay_out_parents(path):
        """The folders above path made (or, in check mode, counted once)."""
        parents = [parent for parent in missing_parents(path) if parent not in changed]
        changed.extend(parents)
        if not module.check_mode:
            make_parents(parents)

    for entry in gone + module.params["files"] + secrets:
        if entry["state"] == "link" and not entry.get("src"):
            module.fail_json(msg="%s: a link needs src" % entry["path"])
        try:
            if needs_change(entry):
                if entry["state"] != "absent":
                    lay_out_parents(entry["path"])
                changed.append(entry["path"])
                if module._diff and entry["state"] == "file" and not entry.get("secret"):
                    diffs.append({"before": _content(entry["path"]) or "", "after": entry["content"],
                                  "before_header": entry["path"], "after_header": entry["path"]})
                if not module.check_mode:
                    apply(entry)
        except (OSError, KeyError, ValueError) as exc:
            module.fail_json(msg="%s: %s" % (entry["path"], exc), changed_paths=changed)
    encrypt = module.params["encrypt_credentials"]
    for credential in module.params["credentials"]:
        try:
            if credential_differs(module, credential, encrypt):
                lay_out_parents(credential["path"])
                changed.append(credential["path"])
                if not module.check_mode:
                    write_credential(module, credential, encrypt)
        except OSError as exc:
            module.fail_json(msg="%s: %s" % (credential["path"], exc), changed_paths=changed)
    for path in unused_paths(module.params["unused"], module.params["named_in"], set(module.params["absent"])):
        changed.append(path)
        if not module.check_mode:
            apply({"path": path, "state": "absent"})
    module.exit_json(changed=bool(changed), changed_paths=changed, diff=diffs)


if __name__ == "__main__":
    main()
