#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Install many systemd units in one step, verified by systemd first."""

from __future__ import annotations

__metaclass__ = type

DOCUMENTATION = r"""
module: consumer_units
short_description: Verify and install systemd unit files, and start or stop timers, in one step
version_added: 0.1.0
description:
  - The engine of the C(batchq.consumers.consumer) role. It takes unit files rendered on the
    controller, checks them all with C(systemd-analyze verify) on a staged copy that carries the
    real unit names, and only then writes the ones whose content changed and reloads systemd.
  - Any warning that systemd prints about a staged unit (an unknown setting, a bad value) fails
    the module before anything is written.
  - It also enables and starts, or stops and disables, timers. Stopping a timer never stops a
    batch that is running.
  - One call does for all consumers what a loop of template and systemd tasks would do with many
    round trips to the host.
options:
  units:
    description:
      - Unit file names and their full content. Only units whose content differs are written.
    type: dict
    default: {}
  unit_dir:
    description: Where the unit files go.
    type: path
    default: /etc/systemd/system
  start:
    description: Timers to enable and start.
    type: list
    elements: str
    default: []
  stop:
    description: Timers to stop and disable.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    details: Units are still verified in check mode; nothing is written, started or stopped.
  diff_mode:
    support: full
  platform:
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
author:
  - batchq.consumers contributors (@batchq)
"""

EXAMPLES = r"""
- name: Install two units and start the timer
  batchq.consumers.consumer_units:
    units:
      batchq-thumbs.service: "{{ lookup('ansible.builtin.template', 'consumer.service.j2') }}"
      batchq-thumbs.timer: "{{ lookup('ansible.builtin.template', 'consumer.timer.j2') }}"
    start:
      - batchq-thumbs.timer
"""

RETURN = r"""
written:
  description: Unit files written (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: [batchq-thumbs.service]
started:
  description: Timers that were enabled or started.
  returned: always
  type: list
  elements: str
  sample: [batchq-thumbs.timer]
stopped:
  description: Timers that were stopped or disabled.
  returned: always
  type: list
  elements: str
  sample: []
"""

import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

LANG_C = {"LANG": "C", "LC_ALL": "C"}


def read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def verify(module, units):
    """Fail unless systemd accepts every unit without a word of complaint."""
    analyze = module.get_bin_path("systemd-analyze", required=True)
    staging = tempfile.mkdtemp(prefix="batchq-verify.")
    try:
        for name, content in units.items():
            with open(os.path.join(staging, name), "w") as handle:
                handle.write(content)
        paths = [os.path.join(staging, name) for name in sorted(units)]
        rc, out, err = module.run_command([analyze, "verify", "--"] + paths, environ_update=LANG_C)
        # verify exits 0 on unknown settings and bad values and only warns,
        # but every such warning about our unit is a mistake in a consumer.
        complaints = [line.replace(staging + "/", "") for line in (out + err).splitlines()
                      if staging in line or any(name in line for name in units)]
        if rc != 0 or complaints:
            module.fail_json(msg="systemd-analyze verify rejects the units: " + " | ".join(
                complaints or (out + err).splitlines()), rc=rc, stdout=out, stderr=err)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def install(module, units, unit_dir):
    written, diffs = [], []
    for name in sorted(units):
        path = os.path.join(unit_dir, name)
        before = read(path)
        if before == units[name]:
            continue
        written.append(name)
        diffs.append({"before": before or "", "after": units[name],
                      "before_header": path if before is not None else "/dev/null", "after_header": path})
        if not module.check_mode:
            handle, temporary = tempfile.mkstemp(dir=unit_dir, prefix=".batchq.")
            with os.fdopen(handle, "w") as stream:
                stream.write(units[name])
            os.chmod(temporary, 0o644)
            module.atomic_move(temporary, path)
    if written and not module.check_mode:
        module.run_command([module.get_bin_path("systemctl", required=True), "daemon-reload"], check_rc=True)
    return written, diffs


def timer_states(module, timers):
    """{timer: (UnitFileState, ActiveState)} in one systemctl call."""
    if not timers:
        return {}
    rc, out, err = module.run_command(
        [module.get_bin_path("systemctl", required=True), "show", "--property=Id,UnitFileState,ActiveState", "--"]
        + timers, environ_update=LANG_C, check_rc=True)
    states = {}
    for block in out.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        states[fields.get("Id")] = (fields.get("UnitFileState", ""), fields.get("ActiveState", ""))
    return states


def switch_timers(module, start, stop):
    systemctl = module.get_bin_path("systemctl", required=True)
    states = timer_states(module, start + stop)
    to_start = [t for t in start if states.get(t) != ("enabled", "active")]
    to_stop = [t for t in stop if states.get(t, ("", ""))[0] == "enabled" or states.get(t, ("", ""))[1] == "active"]
    if not module.check_mode:
        if to_start:
            module.run_command([systemctl, "enable", "--now", "--"] + to_start, check_rc=True)
        if to_stop:
            module.run_command([systemctl, "disable", "--now", "--"] + to_stop, check_rc=True)
    return to_start, to_stop


def main():
    module = AnsibleModule(
        argument_spec={
            "units": {"type": "dict", "default": {}},
            "unit_dir": {"type": "path", "default": "/etc/systemd/system"},
            "start": {"type": "list", "elements": "str", "default": []},
            "stop": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    units = {name: str(content) for name, content in module.params["units"].items()}
    for name in units:
        if "/" in name or name.startswith("."):
            module.fail_json(msg="%r is not a unit file name" % name)
    if units:
        verify(module, units)
    written, diffs = install(module, units, module.params["unit_dir"])
    started, stopped = switch_timers(module, module.params["start"], module.params["stop"])
    module.exit_json(changed=bool(written or started or stopped), written=written,
                     started=started, stopped=stopped, diff=diffs)


if __name__ == "__main__":
    main()
