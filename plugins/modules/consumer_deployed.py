#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The consumers deployed on a host, found by unit prefix; waits until none runs."""

from __future__ import annotations

__metaclass__ = type

DOCUMENTATION = r"""
module: consumer_deployed
short_description: "Internal: list the consumers deployed on a host, and wait until none of them runs a batch"
description:
  - Internal. The collection's role and playbooks call it. It is not a public API and may change
    or go in any release without notice.
  - Finds the consumers that the C(batchq.consumers.consumer) role installed on the host, by their timer
    unit files in C(/etc/systemd/system) whose names start with O(prefix), without any inventory or
    C(consumer_list). The C(batchq.consumers.consumer_control) playbook acts on what it returns.
  - For each consumer it reads from its timer file what starting the timer again needs, as a deploy
    starts it (C(OnBootSec=) is the consumer's C(start_delay), C(AccuracySec=), C(RandomizedDelaySec=)),
    and from the role's record in the same file (a C([X-Batchq]) section, which systemd ignores) its
    number of instances, the C(state) it was deployed with and its metrics folder.
  - A consumer with instances deployed by a release that wrote no record is listed only while systemd has
    its instances loaded (not when paused); deploy once with this release to list it always.
  - With O(wait), it waits on the host until none of the selected consumers runs a batch (its service
    C(activating), or C(deactivating) while its C(ExecStopPost=) runs), and fails naming those still
    running when O(wait) seconds have passed.
  - It changes nothing on the host.
options:
  prefix:
    description: Prefix of the unit names, the role's C(consumer_unit_prefix).
    type: str
    default: batchq-
  names:
    description:
      - Consumers to select, by name; names not deployed on this host are returned in RV(missing).
      - Omitted, every consumer deployed with C(state) V(present) is selected. An empty list selects none.
    type: list
    elements: str
  wait:
    description:
      - Wait up to this many seconds until none of the selected consumers runs a batch, then fail naming
        those still running. V(0) looks once. Omitted, it does not wait.
    type: int
attributes:
  check_mode:
    support: full
    details: The module changes nothing; it also waits in check mode.
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
- name: Find the consumers deployed here
  batchq.consumers.consumer_deployed:
  register: deployed

- name: Wait up to 10 minutes until the thumbnails consumer runs no batch
  batchq.consumers.consumer_deployed:
    names: [thumbnails]
    wait: 600
"""

RETURN = r"""
consumers:
  description: The selected consumers.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The consumer's name.
      type: str
      sample: thumbnails
    state:
      description: The C(state) it was deployed with, V(present) or V(paused).
      type: str
      sample: present
    instances:
      description: Its number of instances (the most, when they are a range).
      type: int
      sample: 2
    timers:
      description: Its timer units, one per instance.
      type: list
      elements: str
      sample: [batchq-thumbs@1.timer, batchq-thumbs@2.timer]
    services:
      description: Its service units, one per instance.
      type: list
      elements: str
      sample: [batchq-thumbs@1.service, batchq-thumbs@2.service]
    scheduled_services:
      description:
        - The service units of the instances that are always scheduled, which C(consumer_control.yml run) starts.
        - All of them, unless the instances are a range; then those up to its C(min). A backlog wakes the others.
      type: list
      elements: str
      sample: [batchq-thumbs@1.service]
    starts:
      description:
        - The O(batchq.consumers.consumer_units#module:start) entries that start its timers as a deploy does.
        - When its instances are a range, those up to its C(min) alone.
      type: list
      elements: dict
      sample: [{timer: batchq-thumbs@1.timer, delay: 5s, accuracy: 1s, jitter: "0"}]
    metrics_dir:
      description: The node_exporter textfile folder of its metrics, or null when it has none.
      type: str
      sample: /var/lib/prometheus/node-exporter
missing:
  description: Names of O(names) that are not deployed on this host.
  returned: always
  type: list
  elements: str
  sample: []
running:
  description: Services of the selected consumers that run a batch (after the wait, with O(wait)).
  returned: always
  type: list
  elements: str
  sample: []
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_deployed import (
    deployed_consumer,
    running,
    read_timer_settings,
    select,
)
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import UNIT_DIR, unit_re
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_unit_states import parse_show

LANG_C = {"LANG": "C", "LC_ALL": "C", "SYSTEMD_COLORS": "0"}


def find(module, systemctl, prefix):
    """Every consumer whose timer file the role installed, sorted by name."""
    pattern = unit_re(prefix)
    files = {}
    for entry in sorted(os.listdir(UNIT_DIR)):
        match = pattern.match(entry)
        if match and match.group("kind") == "timer" and not match.group("dropin") and not match.group("instance"):
            files[match.group("name")] = (entry, bool(match.group("at")))
    if not files:
        return []
    rc, out, err = module.run_command([systemctl, "list-units", "--all", "--plain", "--no-legend", "--",
                                       prefix + "*@*.timer"], environ_update=LANG_C, check_rc=True)
    loaded = {}
    for line in out.splitlines():
        match = pattern.match(line.split()[0]) if line.split() else None
        if match and match.group("instance"):
            loaded.setdefault(match.group("name"), []).append(match.group("instance"))
    found = []
    for name, (entry, template) in files.items():
        settings = read_timer_settings(os.path.join(UNIT_DIR, entry))
        if settings is None:
            continue  # gone since the listing
        consumer = deployed_consumer(name, prefix, settings, loaded.get(name, []) if template else None)
        if consumer:
            found.append(consumer)
    return found


def wait_idle(module, systemctl, services, seconds):
    """The services still running a batch when none is, or when seconds have passed."""
    deadline = time.monotonic() + seconds
    while True:
        rc, out, err = module.run_command([systemctl, "show", "--property=Id,ActiveState", "--"] + services,
                                          environ_update=LANG_C, check_rc=True)
        busy = running(parse_show(out), services)
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def main():
    module = AnsibleModule(
        argument_spec={
            "prefix": {"type": "str", "default": "batchq-"},
            "names": {"type": "list", "elements": "str"},
            "wait": {"type": "int"},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["wait"] is not None and params["wait"] < 0:
        module.fail_json(msg="wait: %d is negative; give seconds, 0 to look once" % params["wait"])
    systemctl = module.get_bin_path("systemctl", required=True)
    chosen, missing = select(find(module, systemctl, params["prefix"]), params["names"])
    services = [service for consumer in chosen for service in consumer["services"]]
    busy = wait_idle(module, systemctl, services, params["wait"] or 0) if services else []
    result = {"changed": False, "consumers": chosen, "missing": missing, "running": busy}
    if params["wait"] is not None and busy:
        module.fail_json(msg="still running after %ds: %s" % (params["wait"], " ".join(busy)), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
