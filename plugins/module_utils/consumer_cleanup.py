# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the role must take away from a host: a pure function of the unit
files found there and the consumers the user wants."""

from __future__ import annotations

import posixpath
import re

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import SCALE_UNIT, starter_unit, unit_re
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_runtime import SCALE_FOLDER
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import MAX_INSTANCES

__metaclass__ = type


def loaded_only(unit):
    """A pattern that matches exactly unit, and only while systemd has it loaded.

    `systemctl stop NAME` fails when no such unit exists (a consumer with
    instances has no plain NAME.timer); a glob that matches nothing does not.
    """
    return "%s[%s]" % (unit[:-1], unit[-1])


def _timers_of(prefix, name, template):
    """Stop patterns for a consumer's timers of one shape and their scheduled starts."""
    unit = prefix + name
    timers = unit + "@*.timer" if template else loaded_only(unit + ".timer")
    return {timers, unit + ".*start.timer"}


def _range_of(prefix, name, kept=None):
    """Stop patterns of what a range of instances has beside its timers: its
    path unit, the scaler's unit of it (to forget it if it failed), and, when
    the consumer stays with kept instances, the timers above kept, which a
    backlog may have woken (never enabled, so no link names them)."""
    stem = prefix + name
    patterns = {loaded_only(stem + ".path"), loaded_only(SCALE_UNIT.replace("@.", "@%s." % stem))}
    if kept is not None:
        patterns.update(loaded_only("%s@%d.timer" % (stem, number)) for number in range(kept + 1, MAX_INSTANCES + 1))
    return patterns


def _scale_records(prefix, name):
    """The scaler's record of a consumer in /run (batchq_scale.py)."""
    path = "%s/%s%s.json" % (SCALE_FOLDER, prefix, name)
    return {path, path + ".lock"}


def leftovers(host_paths, consumers, prefix="batchq-", exclusive=False):
    """Units to stop, services to let finish and paths to delete.

    host_paths: paths below /etc/systemd/system whose names start with prefix
    (unit files, drop-in folders and the symlinks in *.wants folders).
    consumers: the normalised consumers (see consumer_spec.normalize_consumers).
    Returns a dict with sorted lists: ``stop`` (timer globs that match only
    loaded units, for `systemctl stop`), ``drain``
    (service units or globs whose running batch is waited for), ``remove``
    (paths) and ``removed`` (names of consumers that go away entirely).
    """
    wanted = {c["name"]: c for c in consumers if c["state"] != "absent"}
    listed = {c["name"] for c in consumers}
    pattern = unit_re(prefix)
    stop, drain, remove, removed = set(), set(), set(), set()
    for path in host_paths:
        match = pattern.match(posixpath.basename(path.rstrip("/")))
        if not match:
            continue
        name, kind = match.group("name"), match.group("kind")
        template = "@" if match.group("at") else ""
        consumer = wanted.get(name)
        if consumer is None:
            if name not in listed and not exclusive:
                continue
            removed.add(name)
            stop.update(_range_of(prefix, name) if kind == "path" else _timers_of(prefix, name, template))
            drain.update([prefix + name + ".service", prefix + name + "@*.service"])
            remove.update({path} | (_scale_records(prefix, name) if kind == "path" else set()))
            continue
        in_wants = posixpath.basename(posixpath.dirname(path)).endswith(".wants")
        if match.group("dropin"):
            continue  # the user's own drop-ins of a consumer that stays
        if kind == "path":
            if not consumer.get("scale"):
                # Its instances are no longer a range. Those above the count end; one instance is
                # another shape, whose instances all end (below).
                count = consumer["instances"]
                stop.update(_range_of(prefix, name, count if count > 1 else None))
                drain.update(loaded_only("%s%s@%d.service" % (prefix, name, number))
                             for number in range(count + 1, MAX_INSTANCES + 1) if count > 1)
                remove.update({path} | _scale_records(prefix, name))
            continue
        if in_wants:
            timer = posixpath.basename(path)
            if kind == "timer" and timer not in consumer["timers"]:
                stop.update([loaded_only(timer), loaded_only(starter_unit(timer))])
                drain.add(timer[:-len(".timer")] + ".service")  # a drain of that instance must end too
                remove.add(path)
            continue
        if posixpath.basename(path) in (consumer["service_unit"], consumer["timer_unit"]):
            continue
        # A unit of the other shape (plain vs. template) after instances changed.
        stop.update(_timers_of(prefix, name, template))
        drain.add(prefix + name + ("@*" if template else "") + ".service")
        remove.add(path)
    return {
        "stop": sorted(stop),
        "drain": sorted(drain),
        "remove": sorted(remove),
        "removed": sorted(removed),
    }


# A file of the secrets folder and the consumer it belongs to: <name>.env, or
# a credential <name>.<KEY>.cred (the batch's) or .hookcred (its hooks'), in
# clear text or -encrypted.
SECRET_FILE_RE = re.compile(
    r"(?P<name>[a-z0-9][a-z0-9_-]*)(?:\.env|\.[A-Za-z0-9_][A-Za-z0-9_.-]*\.(?:cred|hookcred)(?:-encrypted)?)")


def secret_files_of(consumer, encrypted=False):
    """The secret environment file and credential files a normalised consumer's units name
    (those of the form the host's systemd reads: encrypted or not)."""
    if consumer["state"] == "absent":
        return set()
    paths = {entry["encrypted_path" if encrypted else "path"]
             for entries in consumer["credentials"].values() for entry in entries}
    return paths | ({consumer["secret_file"]} if consumer["secret_file"] else set())


def stale_secrets(found, consumers, removed=(), encrypted=False):
    """The paths of found (the secrets folder's files) that no unit names any more:
    those of listed consumers that no longer have them (or have them in the
    other form), and all of removed consumers (the "removed" of leftovers()).
    A file of a consumer that is neither (another playbook's) is left alone."""
    wanted = set().union(*(secret_files_of(consumer, encrypted) for consumer in consumers))
    owners = {consumer["name"] for consumer in consumers} | set(removed)
    stale = []
    for path in found:
        match = SECRET_FILE_RE.fullmatch(posixpath.basename(path))
        if match and match.group("name") in owners and path not in wanted:
            stale.append(path)
    return sorted(stale)
