# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the role must take away from a host: a pure function of the unit
files found there and the consumers the user wants."""

from __future__ import annotations

import posixpath
import re

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import starter_unit, unit_re

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
            stop.update(_timers_of(prefix, name, template))
            drain.update([prefix + name + ".service", prefix + name + "@*.service"])
            remove.add(path)
            continue
        in_wants = posixpath.basename(posixpath.dirname(path)).endswith(".wants")
        if match.group("dropin"):
            continue  # the user's own drop-ins of a consumer that stays
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
