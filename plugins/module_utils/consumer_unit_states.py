# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The states of units and unit files that systemd reports, asked by the
consumer_preflight module (for the plan) and by the consumer_units module
(before it changes them), in the same words."""

from __future__ import annotations

import re

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import starter_unit
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_protocol import parse_show

__metaclass__ = type

# systemd 247's tools colour their messages even into a pipe.
LANG_C = {"LANG": "C", "LC_ALL": "C", "SYSTEMD_COLORS": "0"}
# The ActiveState of a unit that is on: a timer that waits, a run that starts.
ON = ("active", "activating")


def unit_states(module, units):
    """{unit: (UnitFileState, ActiveState)} in one systemctl call."""
    if not units:
        return {}
    rc, out, err = module.run_command(
        [module.get_bin_path("systemctl", required=True), "show", "--property=Id,UnitFileState,ActiveState", "--"]
        + list(units), environ_update=LANG_C, check_rc=True)
    return {unit: (fields.get("UnitFileState", ""), fields.get("ActiveState", ""))
            for unit, fields in parse_show(out).items()}


def stale_units(module, names):
    """The units among names (templates: their loaded instances) whose file
    systemd has not loaded yet (NeedDaemonReload=yes), by their unit file name."""
    if not names:
        return []
    patterns = {name.replace("@.", "@*."): name for name in names}
    rc, out, err = module.run_command(
        [module.get_bin_path("systemctl", required=True), "show", "--property=Id,NeedDaemonReload", "--"]
        + sorted(patterns), environ_update=LANG_C, check_rc=True)
    stale = set()
    for unit, fields in parse_show(out).items():
        if fields.get("NeedDaemonReload") == "yes":
            stale.add(patterns.get(unit) or patterns.get(re.sub(r"@[^.]*\.", "@*.", unit), unit))
    return sorted(stale)


def starter_units(timer):
    """The scheduled start of a timer: a transient timer and the service it
    runs (systemctl start TIMER)."""
    starter = starter_unit(timer)
    return [starter, starter[:-len(".timer")] + ".service"]


def timer_changes(start, stop, file_state, active, disable=()):
    """What switching the timers changes: (the timers of start to enable, those
    to schedule a start of, the timers of stop to stop, the timers of disable
    to disable), from file_state(unit) (its UnitFileState) and active(unit)
    (active or activating). A timer to start is enabled, and active or its
    start scheduled; one to stop is none of these; one to disable is not
    enabled, and left running. The consumer_units module switches by it, and
    the planner tells from it whether there is anything to switch."""
    def scheduled(timer):
        return any(active(unit) for unit in starter_units(timer))

    return ([timer for timer in start if file_state(timer) != "enabled"],
            [timer for timer in start if not active(timer) and not scheduled(timer)],
            [timer for timer in stop if file_state(timer) == "enabled" or active(timer) or scheduled(timer)],
            [timer for timer in disable if file_state(timer) == "enabled"])
