#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Install many systemd units in one step, verified by systemd first."""

from __future__ import annotations

__metaclass__ = type

DOCUMENTATION = r"""
module: consumer_units
short_description: "Internal: verify and install systemd unit files, and start or stop timers, in one step"
description:
  - Internal. The collection's role and playbooks call it. It is not a public API and may change
    or go in any release without notice.
  - The engine of the C(batchq.consumers.consumer) role. It takes unit files rendered on the
    controller, checks them all with C(systemd-analyze verify) on a staged copy that carries the
    real unit names, and only then writes the ones whose content changed and reloads systemd.
  - Any warning that systemd prints about a staged unit (an unknown setting, a bad value) fails
    the module before anything is written.
  - It also enables and starts, or stops and disables, timers. Stopping a timer never stops a
    batch that is running.
  - A timer is not started at once but O(start[].delay) later, by a transient timer
    C(<unit>.start.timer) (C(batchq-x.start.timer) for C(batchq-x.timer), C(batchq-x.2.start.timer)
    for C(batchq-x@2.timer)) that runs C(systemctl start) on it. The consumer timers have no
    C(OnActiveSec=), which every C(daemon-reload) re-arms; their C(OnBootSec=) elapses at once
    when the timer is started after boot, so the first batch comes O(start[].delay) after the deploy.
  - One call does for all consumers what a loop of template and systemd tasks would do with many
    round trips to the host.
options:
  units:
    description:
      - Unit file names and their full content. Only units whose content differs are written.
    type: dict
    default: {}
  unchanged:
    description:
      - Unit files already in place with the content the caller wants (it compared digests), so not
        sent in O(units); like the units of O(units) that need no writing, they are reloaded when
        systemd has not loaded them yet (RV(reloaded)).
    type: list
    elements: str
    default: []
  unit_dir:
    description: Where the unit files go.
    type: path
    default: /etc/systemd/system
  start:
    description:
      - Timers to enable and start. A timer that is already active, or whose start is already
        scheduled, is left alone. A path unit (the scale-up requests of a consumer whose instances
        are a range) is enabled and started the same way.
    type: list
    elements: dict
    default: []
    suboptions:
      timer:
        description: The timer unit.
        type: str
        required: true
      delay:
        description: A systemd time span after which the timer starts; C(0) starts it now.
        type: str
        default: "0"
      accuracy:
        description: How late systemd may start it (C(AccuracySec=) of the transient timer).
        type: str
        default: 1s
      jitter:
        description: A random delay up to this long is added (C(RandomizedDelaySec=) of the transient timer).
        type: str
        default: "0"
  stop:
    description: Timers to stop and disable, with a start that is still scheduled.
    type: list
    elements: str
    default: []
  disable:
    description:
      - Timers to disable and leave as they are, running or not. These are the instances above C(min)
        of a consumer whose instances are a range. A backlog wakes them, and they go dormant themselves.
    type: list
    elements: str
    default: []
  finish:
    description:
      - Services (names or glob patterns) whose running drain, if any, ends after the batch in
        flight. Consumers that drain a backlog (C(backlog_exit_code)) run batch after batch
        in one activation; they are asked (SIGUSR1 to C(batchq-drain)) to start no further batch.
        A batch in flight is never stopped.
      - The services of O(stop) timers, and services whose unit file O(units) rewrites, are
        finished too.
    type: list
    elements: str
    default: []
  wait:
    description:
      - Seconds to wait, after the drains of O(finish) were asked to end, until no service of
        O(finish) runs (activating, active or deactivating); the module fails naming those still
        running when the time is up. V(0) does not wait. The wait is done on the host, in this
        one call.
    type: int
    default: 0
  run:
    description:
      - Services to start now, each only if it is idle (inactive or failed). A service whose
        batch (or drain) is running is left alone, so a consumer never runs a second batch beside
        a running one; were a timer to start it in between, C(systemctl start) joins that run.
      - Nothing is started in check mode; RV(ran) still says what would start.
    type: list
    elements: str
    default: []
  verify:
    description:
      - Check O(units) with C(systemd-analyze verify) before writing them. Set it to V(false)
        only when the same content was verified on this host just before (the role's preflight).
    type: bool
    default: true
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
      - timer: batchq-thumbs.timer
        delay: 5s
"""

RETURN = r"""
written:
  description: Unit files written (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: [batchq-thumbs.service]
started:
  description: Timers that were enabled, started, or whose start was scheduled.
  returned: always
  type: list
  elements: str
  sample: [batchq-thumbs.timer]
stopped:
  description: Timers that were stopped and disabled (O(stop)), or only disabled (O(disable)).
  returned: always
  type: list
  elements: str
  sample: []
reloaded:
  description:
    - Unit files in O(units) or O(unchanged) that were already in place but that systemd had not loaded yet
      (C(NeedDaemonReload=yes), as when an earlier C(daemon-reload) failed or its connection
      dropped after the files were moved in). They are reloaded, and a drain running under the old
      definition ends after its batch in flight, as for RV(written).
  returned: always
  type: list
  elements: str
  sample: []
in_flight:
  description:
    - Services of the timers in O(stop) that run a batch, whether this call or an earlier one stopped
      the timer. Each batch is left to end. A drain among them that this call paused ends after its
      batch in flight (RV(ending)).
  returned: always
  type: list
  elements: str
  sample: [batchq-thumbs.service]
waiting:
  description:
    - Services of the timers in O(stop) whose start still waits before its batch, for a slot of the
      host's budget. Before systemd 258 such a unit is in C(SubState) C(start-pre); from 258 on, its start
      job waits in systemd's queue. Its batch runs once it gets a slot, and a drain then runs to its end.
  returned: always
  type: list
  elements: str
  sample: []
ending:
  description:
    - Services whose running drain was asked to end after its batch in flight.
    - Named so because ansible-core 2.21 takes a top-level C(finished) for an async job's flag and turns it into a bool.
  returned: always
  type: list
  elements: str
  sample: []
ran:
  description: Services of O(run) that were idle and were started (or would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: [batchq-thumbs@1.service]
busy:
  description: Services of O(run) that were running a batch and were left alone.
  returned: always
  type: list
  elements: str
  sample: [batchq-thumbs@2.service]
"""

import os
import shutil
import signal
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import starter_unit
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_unit_states import (
    LANG_C,
    ON,
    parse_show,
    stale_units,
    starter_units,
    timer_changes,
    unit_states,
)


def read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def verify(module, units):
    """Fail unless systemd accepts every unit without a word of complaint."""
    analyze = module.get_bin_path("systemd-analyze", required=True)
    staging = tempfile.mkdtemp(prefix="batchq-verify.")
    try:
        for name, content in units.items():
            with open(os.path.join(staging, name), "w", encoding="utf-8") as handle:
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


def install(module, units, unit_dir, unchanged=()):
    """Write the units that differ and reload systemd if it does not run what
    is on disk (of these and of unchanged); returns the units written, those
    reloaded alone and the diffs."""
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
            os.makedirs(unit_dir, 0o755, exist_ok=True)  # /etc/systemd/system, or the user's unit_dir
            handle, temporary = tempfile.mkstemp(dir=unit_dir, prefix=".batchq.")
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                stream.write(units[name])
            os.chmod(temporary, 0o644)
            module.atomic_move(temporary, path)
    # Identical files prove nothing: a reload that failed after they were
    # moved in leaves systemd on the old definitions. Ask systemd.
    stale = stale_units(module, sorted(set(unchanged) | {name for name in units if name not in written}))
    if (written or stale) and not module.check_mode:
        module.run_command([module.get_bin_path("systemctl", required=True), "daemon-reload"], check_rc=True)
    return written, stale, diffs


def finish_drains(module, patterns):
    """Ask the running drains among the services matching patterns to end after
    their batch in flight; returns the services asked.

    Only a main process that is batchq-drain is signalled: SIGUSR1 would kill
    any other consumer.
    """
    if not patterns or module.check_mode:
        return []
    systemctl = module.get_bin_path("systemctl", required=True)
    rc, out, err = module.run_command([systemctl, "list-units", "--plain", "--no-legend", "--state=activating",
                                       "--"] + patterns, environ_update=LANG_C, check_rc=True)
    batches = [line.split()[0] for line in out.splitlines() if line.strip()]
    if not batches:
        return []
    rc, out, err = module.run_command([systemctl, "show", "--property=Id,MainPID", "--"] + batches,
                                      environ_update=LANG_C, check_rc=True)
    asked = []
    for unit, fields in parse_show(out).items():
        pid = int(fields.get("MainPID") or 0)
        if pid > 0 and drain_ready(pid):
            try:
                os.kill(pid, signal.SIGUSR1)
                asked.append(unit)
            except ProcessLookupError:
                pass  # the run ended meanwhile
    return asked


def starts_now(module, services):
    """(the services that run a batch, those whose start still waits) among
    services. A oneshot's ExecStart= runs in SubState "start". No batch began
    yet in "start-pre" (before systemd 258 a start waits there for a slot of
    the host's budget, or runs the environment check), nor while a start job
    waits in systemd's queue (from 258 on, for a slot). Each batch comes once
    its start gets a slot."""
    if not services:
        return [], []
    rc, out, err = module.run_command([module.get_bin_path("systemctl", required=True), "show",
                                       "--property=Id,ActiveState,SubState,Job", "--"] + services,
                                      environ_update=LANG_C, check_rc=True)
    shown = parse_show(out)
    states = [(service, shown.get(service, {})) for service in services]
    return ([service for service, state in states if state.get("ActiveState") == "activating"
             and state.get("SubState") != "start-pre"],
            [service for service, state in states if state.get("SubState") == "start-pre"
             or (state.get("ActiveState") in ("inactive", "failed") and state.get("Job"))])


def drain_ready(pid, patience=5.0):
    """Whether pid is batchq-drain, waiting until it handles SIGUSR1: a runner
    that is still starting would be killed by it."""
    deadline = time.monotonic() + patience
    while True:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as handle:
                if b"batchq-drain" not in handle.read():
                    return False
            with open("/proc/%d/status" % pid, encoding="utf-8") as handle:
                caught = next(int(line.split()[1], 16) for line in handle if line.startswith("SigCgt:"))
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            return False
        if caught & (1 << (signal.SIGUSR1 - 1)) or time.monotonic() > deadline:
            return bool(caught & (1 << (signal.SIGUSR1 - 1)))
        time.sleep(0.05)


def schedule_start(module, timer, delay, accuracy, jitter):
    """Start timer after delay by a transient timer that outlives this module run."""
    systemctl = module.get_bin_path("systemctl", required=True)
    if delay.strip() in ("0", "0s", ""):
        module.run_command([systemctl, "start", "--", timer], check_rc=True)
        return
    starter = starter_unit(timer)
    # A starter that elapsed is unloaded (RemainAfterElapse=no, --collect); one
    # that failed would block the name, so it is cleared first.
    module.run_command([systemctl, "reset-failed", "--", starter, starter.replace(".timer", ".service")])
    module.run_command([
        module.get_bin_path("systemd-run", required=True), "--quiet",
        "--unit=" + starter[:-len(".timer")], "--description=Start %s after its start_delay" % timer,
        "--on-active=" + delay, "--timer-property=AccuracySec=" + accuracy,
        # Long after boot the consumer's own timer fires at once when started,
        # so the spread of a fleet's first batches is the starter's to make.
        "--timer-property=RandomizedDelaySec=" + jitter,
        "--timer-property=RemainAfterElapse=no", "--collect",
        "--", systemctl, "start", "--no-block", timer], check_rc=True)


def stop_starters(module, starters):
    """Stop the scheduled starts of timers (a timer stopped before its service
    runs, or the service that is running). A starter ends and is unloaded
    (--collect) on its own, maybe between the check that it is active and the
    stop: systemctl then fails with "not loaded". Only one still active is an error."""
    if not starters:
        return
    rc, out, err = module.run_command([module.get_bin_path("systemctl", required=True), "stop", "--"] + starters,
                                      environ_update=LANG_C)
    if rc != 0:
        # (UnitFileState, ActiveState) of each
        left = [unit for unit, shown in unit_states(module, starters).items() if shown[1] in ON]
        if left:
            module.fail_json(msg="Failed to stop %s: %s" % (" ".join(left), err.strip()), rc=rc, stderr=err)


def switch_timers(module, start, stop, disable=()):
    systemctl = module.get_bin_path("systemctl", required=True)
    timers = [entry["timer"] for entry in start] + stop + list(disable)
    starters = {timer: starter_units(timer) for timer in timers}
    states = unit_states(module, timers + [unit for pair in starters.values() for unit in pair])

    def file_state(unit):
        return states.get(unit, ("", ""))[0]

    def active(unit):
        return states.get(unit, ("", ""))[1] in ON

    to_enable, scheduling, to_stop, to_disable = timer_changes([entry["timer"] for entry in start], stop, file_state,
                                                               active, disable)
    to_schedule = [entry for entry in start if entry["timer"] in scheduling]
    if not module.check_mode:
        # Enabling reloads systemd; schedule the starts after it.
        if to_enable:
            module.run_command([systemctl, "enable", "--"] + to_enable, check_rc=True)
        for entry in to_schedule:
            schedule_start(module, entry["timer"], entry["delay"], entry["accuracy"], entry["jitter"])
        if to_stop:
            stop_starters(module, [unit for t in to_stop for unit in starters[t] if active(unit)])
            module.run_command([systemctl, "disable", "--now", "--"] + to_stop, check_rc=True)
        if to_disable:
            module.run_command([systemctl, "disable", "--"] + to_disable, check_rc=True)
    started = sorted(set(to_enable) | {e["timer"] for e in to_schedule})
    return started, sorted(set(to_stop) | set(to_disable)), [timer[:-len(".timer")] + ".service" for timer in to_stop]


def running(module, patterns):
    """The services matching patterns that are running a batch."""
    rc, out, err = module.run_command(
        [module.get_bin_path("systemctl", required=True), "list-units", "--plain", "--no-legend",
         "--state=activating,active,deactivating", "--"] + patterns, environ_update=LANG_C, check_rc=True)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def wait_until_idle(module, patterns, seconds):
    """Wait until no service matching patterns runs, or fail after seconds."""
    if not patterns or seconds <= 0 or module.check_mode:
        return
    deadline = time.monotonic() + seconds
    while True:
        busy = running(module, patterns)
        if not busy:
            return
        if time.monotonic() > deadline:
            module.fail_json(msg="still running after %ds (consumer_drain_timeout): %s" % (seconds, " ".join(busy)),
                             busy=busy)
        time.sleep(0.5)


def run_idle(module, services):
    """Start the idle services among services now; returns (started, busy)."""
    states = unit_states(module, services)
    idle = [s for s in services if states.get(s, ("", ""))[1] in ("inactive", "failed")]
    busy = [s for s in services if s not in idle]
    if idle and not module.check_mode:
        # --no-block: a drain runs for as long as work waits; this only starts it.
        module.run_command([module.get_bin_path("systemctl", required=True), "start", "--no-block", "--"] + idle,
                           check_rc=True)
    return idle, busy


def main():
    module = AnsibleModule(
        argument_spec={
            "units": {"type": "dict", "default": {}},
            "unchanged": {"type": "list", "elements": "str", "default": []},
            "unit_dir": {"type": "path", "default": "/etc/systemd/system"},
            "verify": {"type": "bool", "default": True},
            "start": {"type": "list", "elements": "dict", "default": [], "options": {
                "timer": {"type": "str", "required": True},
                "delay": {"type": "str", "default": "0"},
                "accuracy": {"type": "str", "default": "1s"},
                "jitter": {"type": "str", "default": "0"},
            }},
            "stop": {"type": "list", "elements": "str", "default": []},
            "disable": {"type": "list", "elements": "str", "default": []},
            "finish": {"type": "list", "elements": "str", "default": []},
            "run": {"type": "list", "elements": "str", "default": []},
            "wait": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    units = {name: str(content) for name, content in module.params["units"].items()}
    for name in units:
        if "/" in name or name.startswith("."):
            module.fail_json(msg="%r is not a unit file name" % name)
    if units and module.params["verify"]:
        verify(module, units)
    written, reloaded, diffs = install(module, units, module.params["unit_dir"], module.params["unchanged"])
    # A drain started under the old definition ends after its batch in flight;
    # the next batch runs under the new one (batchq.continue@.service).
    rewritten = [name.replace("@.service", "@*.service") for name in written + reloaded if name.endswith(".service")]
    started, stopped, paused_services = switch_timers(module, module.params["start"], module.params["stop"],
                                                      module.params["disable"])
    # what the timers stopped leave to end, whether this call or an earlier one stopped them
    in_flight, waiting = starts_now(module, [timer[:-len(".timer")] + ".service" for timer in module.params["stop"]])
    ending = finish_drains(module, sorted(set(rewritten + paused_services + module.params["finish"])))
    wait_until_idle(module, module.params["finish"], module.params["wait"])
    ran, busy = run_idle(module, module.params["run"])
    module.exit_json(changed=bool(written or reloaded or started or stopped or ending or ran), written=written,
                     reloaded=reloaded, started=started, stopped=stopped, in_flight=in_flight, waiting=waiting,
                     ending=ending, ran=ran, busy=busy, diff=diffs)


if __name__ == "__main__":
    main()
