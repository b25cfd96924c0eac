# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the role can do on a host, decided from its systemd version."""

from __future__ import annotations

import re

__metaclass__ = type

# The oldest systemd the role makes safe: 247 (Debian 11) has every sandbox
# setting of the service template (ProtectProc= and ProcSubset= came in 247)
# and is tested; below it, a unit would lose part of its sandbox or be refused.
MINIMUM = 247

# Parts of the units left out on an older systemd, each with the first version
# that has it. A drain's OnSuccess= continuation needs OnSuccess= (249) and the
# MONITOR_* variables its unit reads (250).
FEATURES = {
    "drain_continue": 250,
    # LoadCredentialEncrypted= and systemd-creds: credentials encrypted at rest
    # with the host key (or a TPM2); below, LoadCredential= of a root-only file.
    "credentials_encrypted": 250,
    # A unit gets its credentials though /run is a private mount, as in a
    # docker or podman container. systemd mounts them in a namespace of its
    # own and, up to 257 at least, counts on /run to pass the mount on.
    # Measured: 247, 252 and 257 cannot, root's units included; 262 can. The
    # versions between were not measured, so they count as unable.
    "credentials_private_run": 262,
    # A unit with credentials and a mount namespace (the role's sandbox) can
    # run a command before its main one (ExecStartPre=, "+" or not). systemd
    # 247 makes the credentials' folder only for the main command: every
    # earlier one fails at step NAMESPACE (226). Measured: 247 cannot, 252
    # and 257 can; the versions between count as unable.
    "credentials_before_start": 252,
    # ConcurrencySoftMax= of a slice: a start waits in the job queue while the
    # slice runs that many units. consumer_budget.running_max uses it; below,
    # each unit waits for a slot itself (batchq_slots.py).
    "slice_concurrency": 258,
}


class SystemdVersionError(ValueError):
    pass


def systemd_version(text):
    """The release number in `systemctl --version`'s first line, e.g. 247 of
    "systemd 247 (247.3-7+deb11u5)"."""
    match = re.match(r"\s*systemd (\d+)\b", text or "")
    if not match:
        first = (text or "").strip().splitlines()[:1]
        raise SystemdVersionError("no systemd version in `systemctl --version`: %r" % (first[0] if first else ""))
    return int(match.group(1))


def systemd_support(text, host="this host"):
    """{"version", "features": {name: bool}, "refusal": why the role refuses the host, or ""}."""
    try:
        version = systemd_version(text)
    except SystemdVersionError as exc:
        return {"version": None, "features": dict.fromkeys(FEATURES, False), "refusal": "%s: %s" % (host, exc)}
    refusal = ""
    if version < MINIMUM:
        refusal = ("%s has systemd %d; the batchq.consumers.consumer role needs systemd %d or later"
                   % (host, version, MINIMUM))
    return {"version": version, "features": {name: version >= first for name, first in FEATURES.items()},
            "refusal": refusal}
