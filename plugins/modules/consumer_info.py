#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

__metaclass__ = type

DOCUMENTATION = r"""
module: consumer_info
short_description: Report the last runs of batch queue consumers from systemd and the journal
version_added: 0.1.0
description:
  - Reports every consumer installed by the C(batchq.consumers.consumer) role on a host, or the
    ones named, with its state, its timer, its last run with that run's own log lines, a history
    of finished runs and a summary.
  - Runs are told apart by systemd's invocation ID, so the log lines of a run are that run's only.
  - Two C(systemctl show) calls cover all units; journal reads are bounded by unit, by invocation
    and by count, never a scan of the whole journal.
  - For the whole fleet in one table, run the C(batchq.consumers.consumer_status) playbook, which calls
    this module on every host.
requirements:
  - systemd 247 or later on the host (Debian 11 and later), with C(systemctl) and C(journalctl).
  - Read access to the system journal on the host, as root (C(become=true)) or as a member of the
    C(systemd-journal) group.
notes:
  - Run by a user who cannot read the system journal, the module fails with a message that says so. It
    never reports empty histories instead.
  - When the journal has lost a run (rotated, or kept in memory only and lost at a reboot), the module
    says so in a warning and still reports what systemd knows.
  - Checked on systemd 247 (Debian 11), 252 (Debian 12), 257 (Debian 13) and 262 (Debian testing).
  - 50 consumers with O(history=20) take about 0.5 s on the host (the performance guide).
seealso:
  - ref: ansible_collections.batchq.consumers.docsite.playbooks.consumer_status
    description: The C(consumer_status) playbook. It runs this module on every host, prints one table for the
      fleet, writes a JSON report and can fail as a monitoring check.
  - ref: ansible_collections.batchq.consumers.docsite.monitoring
    description: The monitoring guide. It shows how to read the runs, the Prometheus metrics, the failure
      hooks and the alert rules.
  - plugin: batchq.consumers.consumer_status_table
    plugin_type: filter
    description: The fleet's reports of this module as a table.
  - plugin: batchq.consumers.consumer_status_problems
    plugin_type: filter
    description: What a monitoring check of the reports of this module fails on.
options:
  names:
    description:
      - Consumers to report, by name (C(thumbs)) or instance (C(thumbs@2)); a name of a consumer
        with instances reports all its loaded instances.
      - Default is every consumer on the host with O(prefix).
    type: list
    elements: str
    default: []
  prefix:
    description: Prefix of the consumers' unit names.
    type: str
    default: batchq-
  history:
    description: How many finished runs to report per consumer, newest first.
    type: int
    default: 5
  log_lines:
    description: How many lines of the last run's own output to report (its last ones).
    type: int
    default: 20
attributes:
  check_mode:
    support: full
    details: The module only reads.
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
- name: Report every consumer of the host
  batchq.consumers.consumer_info:
  register: consumers

- name: Fail when the thumbnails consumer failed its last run
  ansible.builtin.assert:
    that: consumers.consumers.thumbnails.state != 'failed'
    fail_msg: "{{ consumers.consumers.thumbnails.last_run.log | join('\n') }}"

- name: Two consumers, a longer history, no log lines
  batchq.consumers.consumer_info:
    names: [thumbnails, mailer]
    history: 20
    log_lines: 0
"""

RETURN = r"""
consumers:
  description: The consumers, keyed by name, or C(name@N) for instances.
  returned: always
  type: dict
  contains:
    state:
      description:
        - C(running) a batch runs now.
        - C(waiting-for-slot) a start waits for a slot of the host's budget, because as many consumer
          units run now as the role's C(consumer_budget.running_max) allows. This is not a failure, and
          the start is not lost. Each wait is counted in the metric C(batchq_consumer_slot_wait_seconds_total).
        - C(waiting) the timer is armed, or the role's starter timer will arm it after C(start_delay)
          (see RV(consumers.timer.next_run)), and the last run, if any, succeeded.
        - C(dormant) an instance above C(min) of a consumer whose instances are a range. Its timer is off
          until a backlog wakes it. Every instance up to C(max) is reported, woken since boot or not.
        - C(failed) as C(waiting), but the last run failed.
        - C(paused) the timer is stopped and disabled, as the role leaves a consumer with
          C(state=paused). Each instance is reported, though systemd keeps no unit of a stopped and
          disabled instance. The role's record in the timer's file counts them. A paused consumer with
          instances whose timer file was written before the role kept that record is reported once, under
          its bare name, with no runs.
        - C(stopped) the timer is enabled but inactive (stopped by hand) or failed, and no starter
          timer is about to arm it, so no batch will run until someone starts it.
        - C(missing) named in O(names) but not installed.
      type: str
      choices: [waiting, running, waiting-for-slot, dormant, failed, paused, stopped, missing]
      sample: waiting
    timer:
      description: The consumer's timer; null when missing.
      type: dict
      contains:
        enabled:
          description: Enabled at boot.
          type: bool
          sample: true
        active:
          description: Armed now.
          type: bool
          sample: true
        last_trigger:
          description: When it last started the service, ISO 8601 in UTC.
          type: str
          sample: "2026-11-29T11:58:26Z"
        next_run:
          description:
            - When it will next start it, ISO 8601 in UTC; null when not armed or while a batch runs.
            - While the role's starter timer has yet to arm the timer, when the starter fires.
          type: str
          sample: "2026-11-29T11:59:27.672258Z"
    last_run:
      description:
        - The latest finished run, the one of the service's current invocation ID; null when the
          consumer never finished a run.
        - A run that failed before its process started (result C(resources), such as a missing
          mandatory C(EnvironmentFile=)) has no C(exit_code) and C(exit_status), and its C(started)
          and C(finished) are those of its start job. The role's units check their environment file
          in C(ExecStartPre=) instead, so a run without it fails with C(exit-code), the check's exit
          status 1 and the line that names the file in its log.
      type: dict
      contains:
        invocation_id:
          description: systemd's invocation ID of the run.
          type: str
          sample: 38c5427853b64485928f62ecb3a6e0e7
        started:
          description: Start, ISO 8601 in UTC.
          type: str
          sample: "2026-11-29T11:58:40.645629Z"
        finished:
          description: End, ISO 8601 in UTC.
          type: str
          sample: "2026-11-29T11:58:43.651733Z"
        duration_s:
          description: Seconds from start to end.
          type: float
          sample: 3.006
        result:
          description: systemd's C(Result), such as C(success), C(exit-code), C(signal), C(timeout), C(oom-kill), C(core-dump).
          type: str
          sample: success
        exit_code:
          description: How the main process ended, C(exited), C(killed) or C(dumped).
          type: str
          sample: exited
        exit_status:
          description: The exit status, or the signal name (such as C(SEGV)) when killed or dumped.
          type: raw
          sample: 0
        log:
          description:
            - The last O(log_lines) lines that run wrote, oldest first.
            - For a consumer that drains a backlog (C(backlog_exit_code)), the lines of the run's last batch only.
          type: list
          elements: str
          sample: [processed 100 items]
        batches:
          description:
            - How many batches the run had, for a consumer that drains a backlog (C(backlog_exit_code)).
              Its batches follow each other in one run while each says more work is waiting.
            - Only for such consumers.
          type: int
          sample: 42
        last_batch:
          description:
            - The run's last batch, from the record C(batchq-drain) writes at its end; only for
              consumers with C(backlog_exit_code).
            - Once the next run has started, systemd no longer keeps the run's status. The batch is then
              read from the journal alone, from the records of the run's runner. It is null when the
              journal no longer holds them.
          type: dict
          contains:
            number:
              description: Its number in the run, from 1.
              type: int
              sample: 42
            started:
              description: Start, ISO 8601 in UTC.
              type: str
              sample: "2026-11-29T11:58:40.645629Z"
            finished:
              description: End, ISO 8601 in UTC.
              type: str
              sample: "2026-11-29T11:58:40.745629Z"
            duration_s:
              description: Seconds from start to end.
              type: float
              sample: 0.1
            result:
              description:
                - C(success) (the queue was empty), C(backlog) (more work waits), C(exit-code), C(signal) or
                  C(timeout) (killed at C(timeout), and at C(stop_timeout) after that if it lived on).
                - A run whose last batch timed out has result C(timeout) too.
              type: str
              sample: success
            exit_status:
              description: The exit status, or the signal's name.
              type: raw
              sample: 0
    running_since:
      description: When the running batch began, ISO 8601 in UTC; null when none runs.
      type: str
      sample: null
    history:
      description: The last O(history) finished runs, newest first, with the fields of RV(consumers.last_run) but C(log).
      type: list
      elements: dict
    summary:
      description: Figures over RV(consumers.history).
      type: dict
      contains:
        runs:
          description: Runs in the history.
          type: int
          sample: 5
        failures:
          description: Runs whose result was not success.
          type: int
          sample: 1
        success_rate:
          description: Share of successful runs from 0 to 1; null without runs.
          type: float
          sample: 0.8
        mean_duration_s:
          description: Mean duration in seconds; null without runs.
          type: float
          sample: 3.004
"""

import glob
import json
import os
import pwd
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_deployed import read_timer_settings
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import SLICE_UNIT, UNIT_DIR
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_protocol import BATCH_END, BATCH_FIELDS, RUN_START
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_runs import (
    RUN_MESSAGES,
    SERVICE_PROPERTIES,
    SLICE_PROPERTIES,
    TIMER_PROPERTIES,
    consumer_report,
    consumer_units,
    dormant,
    group_journal,
    is_drain,
    iso,
    monotonic_twins,
    parse_batch_end,
    parse_batch_status,
    parse_journal_lines,
    parse_journal_runs,
    parse_runner,
    precise_timestamps,
    template_show,
    with_instances,
)
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_unit_states import parse_show

# TZ: systemd before 248 prints show's timestamps in the local zone whatever --timestamp says.
LANG_C = {"LANG": "C", "LC_ALL": "C", "TZ": "UTC"}
# Where journald keeps the system journal: persistent, then volatile (journald.conf(5)).
JOURNAL_FILES = ("/var/log/journal/*/system*.journal", "/run/log/journal/*/system*.journal")


class CommandError(Exception):
    """A command failed; raised in worker threads, reported by the main thread."""


class Host:
    """The commands the module runs, as argv lists with a C locale."""

    def __init__(self, module):
        self.module = module
        self.systemctl = module.get_bin_path("systemctl", required=True)
        self.journalctl = module.get_bin_path("journalctl", required=True)

    def run(self, argv):
        rc, out, err = self.module.run_command(argv, environ_update=LANG_C)
        if rc != 0:
            raise CommandError("%s failed (rc=%d): %s" % (" ".join(argv), rc, err.strip()))
        return out

    def run_listing(self, argv):
        """A systemctl listing: systemd 257 and later exit 1 from list-unit-files
        when no file matches its patterns, with nothing on stdout or stderr."""
        rc, out, err = self.module.run_command(argv, environ_update=LANG_C)
        if rc == 1 and not out.strip() and not err.strip():
            return ""
        if rc != 0:
            raise CommandError("%s failed (rc=%d): %s" % (" ".join(argv), rc, err.strip()))
        return out

    def units(self, prefix, pool):
        pattern = [prefix + "*.service", prefix + "*.timer"]
        return "".join(pool.map(self.run_listing, (
            [self.systemctl, "list-unit-files", "--no-legend", "--plain", "--"] + pattern,
            [self.systemctl, "list-units", "--all", "--no-legend", "--plain", "--"] + pattern)))

    def show(self, units, properties):
        if not units:
            return {}
        asked = list(properties) + monotonic_twins(properties)
        out = self.run([self.systemctl, "show", "--timestamp=us+utc", "--property=" + ",".join(asked), "--"] + units)
        return precise_timestamps(parse_show(out), time.time(), time.monotonic())

    def runs(self, services, history):
        """{service: its runs} for the services one journalctl read covers.

        A run leaves three to five manager messages; one more run covers a
        running batch: each service needs its newest (history + 2) * 5. One
        read of that many per service for all of them (matches on one field
        are alternatives) has them all, unless it was cut short and a busy
        consumer crowded a quiet one out: that one is left out, to be read alone.
        """
        wanted = (history + 2) * 5
        limit = wanted * len(services)
        matches = ["UNIT=" + service for service in services] + ["MESSAGE_ID=" + message for message in RUN_MESSAGES]
        out = self.run([
            self.journalctl, "--no-pager", "--output=json", "--reverse", "--lines=%d" % limit,
            "--output-fields=MESSAGE_ID,INVOCATION_ID,UNIT_RESULT,EXIT_CODE,EXIT_STATUS,UNIT,_SOURCE_REALTIME_TIMESTAMP",
            "--"] + matches)
        complete = len(out.splitlines()) < limit
        groups = group_journal(out, "UNIT")
        return {service: parse_journal_runs("\n".join(groups.get(service, [])[:wanted])) for service in services
                if complete or len(groups.get(service, [])) >= wanted}

    def logs(self, runs, lines, batch=None):
        """{invocation: the last lines of its own output} for runs (or for one
        batch of a drain: batch, the journal matches of its lines), read from
        their start (or end) on, in one journalctl read; as runs(), a run
        crowded out by others is left out."""
        runs = [run for run in runs if run["invocation_id"]]
        if not lines or not runs:
            return {run["invocation_id"]: [] for run in runs}
        since = min(datetime.fromisoformat((run["started"] or run["finished"]).replace("Z", "+00:00")).timestamp()
                    for run in runs)
        limit = lines * len(runs) + (1 if batch else 0)  # a batch's lines, then its end record
        out = self.run([
            self.journalctl, "--no-pager", "--output=json",
            "--output-fields=MESSAGE,_SYSTEMD_INVOCATION_ID,SYSLOG_IDENTIFIER",
            "--lines=%d" % limit, "--since=@%d" % (int(since) - 1)]
            + ["_SYSTEMD_INVOCATION_ID=" + run["invocation_id"] for run in runs] + (batch or []))
        if batch:  # the runner's own records (its end record) are not the batch's lines
            out = "\n".join(line for line in out.splitlines()
                            if line.strip() and json.loads(line).get("SYSLOG_IDENTIFIER") != RUNNER_IDENTIFIER)
        complete = len(out.splitlines()) < limit
        groups = group_journal(out, "_SYSTEMD_INVOCATION_ID")
        return {run["invocation_id"]: parse_journal_lines("\n".join(groups.get(run["invocation_id"], [])[-lines:]))
                for run in runs if complete or len(groups.get(run["invocation_id"], [])) >= lines}

    def log(self, run, lines, batch=None):
        """The last lines of one run's own output (of one batch of a drain)."""
        return self.logs([run], lines, batch).get(run["invocation_id"], [])

    def runner(self, run):
        """The PID of a drain run's runner, from the run's start records (journald sets _PID), or 0."""
        return parse_runner(self.run([
            self.journalctl, "--no-pager", "--output=json", "--output-fields=_PID",
            "MESSAGE_ID=" + RUN_START, "_SYSTEMD_INVOCATION_ID=" + run["invocation_id"]]))

    def last_batch(self, run, runner):
        """The last batch of a drain run, from the end record of its runner
        (process runner of that run: fields journald sets, which no other
        process can forge), or None."""
        return parse_batch_end(self.run([
            self.journalctl, "--no-pager", "--output=json", "--reverse", "--lines=1",
            "--output-fields=" + ",".join(BATCH_FIELDS), "MESSAGE_ID=" + BATCH_END,
            "_SYSTEMD_INVOCATION_ID=" + run["invocation_id"], "_PID=%d" % runner]))


# SYSLOG_IDENTIFIER of batchq-drain's own records
RUNNER_IDENTIFIER = "batchq-drain"


def last_batch(host, service, run):
    """The last batch of a drain's run and the PID of its runner: what its
    StatusText says (kept by systemd, whatever the journal dropped), with the
    times of the runner's end record. Once a newer run started, systemd keeps
    neither the run's StatusText nor its PID: then the journal alone tells
    both. (None, 0) when neither knows the run."""
    if service.get("InvocationID") == run["invocation_id"] and service.get("ExecMainPID", "0").isdigit():
        runner = int(service["ExecMainPID"])
        said = parse_batch_status(service.get("StatusText"))
    else:
        runner, said = host.runner(run), None
    recorded = host.last_batch(run, runner) if runner else None
    if recorded and (said is None or recorded["number"] == said["number"]):
        return recorded, runner
    return said, runner


def journal_refusal():
    """Why this user cannot read the system journal, or None when it can.

    Without access journalctl shows only the user's own entries, or none:
    every consumer would look as if it had never run.
    """
    if os.geteuid() == 0:
        return None
    files = [path for pattern in JOURNAL_FILES for path in glob.glob(pattern)]
    if any(os.access(path, os.R_OK) for path in files):
        return None
    user = pwd.getpwuid(os.geteuid()).pw_name
    return ("consumer_info runs as user %s, who cannot read the system journal (%s), so it cannot report any "
            "run: run it as root (become: true) or add %s to the systemd-journal group"
            % (user, ", ".join(sorted(files)) or "no journal file found", user))


def instance_counts(found, prefix):
    """{name: (min, max)} of the consumers found with instances, from the
    record ([X-Batchq]) in their timer template's file. min is max for a
    fixed number. A template written before the record is left out."""
    counts = {}
    for name in sorted({key.split("@")[0] for key in found if "@" in key or "template" in found[key]}):
        settings = read_timer_settings("%s/%s%s@.timer" % (UNIT_DIR, prefix, name))
        most = settings and settings["instances"]
        if most:
            counts[name] = (min(settings["min_instances"] or most, most), most)
    return counts


def wanted(found, names, prefix):
    """The consumers to report: every one found, or the named ones (missing if absent)."""
    if not names:
        return found
    chosen = {}
    for name in names:
        matches = {key: units for key, units in found.items() if key == name or key.startswith(name + "@")}
        chosen.update(matches or {name: {"service": prefix + name + ".service", "timer": prefix + name + ".timer"}})
    return chosen


def shares(services, most=4, least=8):
    """services in up to `most` lists of at least `least` each (one list when
    there are fewer), every service in one of them, for reads side by side."""
    count = min(most, max(1, len(services) // least))
    return [services[i::count] for i in range(count)] if services else []


def main():
    module = AnsibleModule(
        argument_spec={
            "names": {"type": "list", "elements": "str", "default": []},
            "prefix": {"type": "str", "default": "batchq-"},
            "history": {"type": "int", "default": 5},
            "log_lines": {"type": "int", "default": 20},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["history"] < 0 or params["log_lines"] < 0:
        module.fail_json(msg="history and log_lines must not be negative")
    refusal = journal_refusal()
    if refusal:
        module.fail_json(msg=refusal)
    host = Host(module)
    # Commands wait mostly on systemd and the disk: those that need not wait
    # for each other run side by side.
    pool = ThreadPoolExecutor(max_workers=4)
    try:
        found = consumer_units(host.units(params["prefix"], pool), params["prefix"])
        # systemd lists no instance it has let go of (paused, or dormant
        # since boot): each one the record counts is shown by name.
        counts = instance_counts(found, params["prefix"])
        for name, (least, most) in counts.items():
            found = with_instances(found, name, params["prefix"], most)
        chosen = wanted(found, params["names"], params["prefix"])
        # systemctl refuses to show a template: those come from template_show().
        shown = [units for units in chosen.values() if "template" not in units]
        timers_read = pool.submit(
            host.show, [units[kind] for units in shown for kind in ("timer", "starter") if kind in units],
            TIMER_PROPERTIES)
        # batchq.slice in the same call: its running cap (systemd 258 and later) tells a start that waits for a slot
        services = host.show([units["service"] for units in shown] + ([SLICE_UNIT] if shown else []),
                             SERVICE_PROPERTIES + SLICE_PROPERTIES)
        now_realtime, now_monotonic = time.time(), time.monotonic()
        # The runs of all consumers in one journalctl read (up to four side by
        # side for many consumers), the logs of their last runs in one: a
        # process per consumer costs more than the reading, and the output of
        # one read (megabytes for 50 consumers with a long history) costs more
        # to take in than to find. The journal is read after the services were
        # shown: it holds every run they know of.
        journaled = sorted(units["service"] for units in shown
                           if services.get(units["service"], {}).get("LoadState") == "loaded")
        runs_read = {}
        for part in pool.map(lambda share: host.runs(share, params["history"]), shares(journaled)):
            runs_read.update(part)
        timers = timers_read.result()
    except CommandError as exc:
        pool.shutdown(wait=False)
        module.fail_json(msg=str(exc))

    def read(key):
        """One consumer's report; a read the shared ones did not cover is its own."""
        units = chosen[key]
        if "template" in units:
            service, timer = template_show(units)
        else:
            service = services.get(units["service"], {"LoadState": "not-found"})
            timer = timers.get(units["timer"], {})
        try:
            runs = []
            if units["service"] in runs_read:
                runs = runs_read[units["service"]]
            elif units["service"] in journaled:
                runs = host.runs([units["service"]], params["history"])[units["service"]]
            consumer, said = consumer_report(service, timer, runs, [], params["history"], now_realtime,
                                             now_monotonic, timers.get(units.get("starter")), services.get(SLICE_UNIT))
            last = consumer["last_run"]
            batch_lines = None  # the journal matches of a drain's last batch's lines
            if last is not None and last["invocation_id"] and is_drain(service):
                batch, runner = last_batch(host, service, last)
                last["batches"] = batch["number"] if batch else 0
                last["last_batch"] = batch and dict(batch, started=iso(batch["started"]),
                                                    finished=iso(batch["finished"]))
                if batch and batch["result"] == "timeout":
                    last["result"] = "timeout"  # the runner, not systemd, times a drain's batches out
                if batch:
                    # relayed by the runner: its _PID, the batch's number
                    batch_lines = ["_PID=%d" % runner, "BATCHQ_BATCH=%d" % batch["number"]]
            # a drain's last batch is read alone; every other log in one read, below
            shared_log = last is not None and not batch_lines
            if last is not None and batch_lines:
                last["log"] = host.log(last, params["log_lines"], batch_lines)
        except CommandError as exc:
            return key, None, [], str(exc), False
        return key, consumer, said, None, shared_log

    def read_log(last):
        try:
            last["log"] = host.log(last, params["log_lines"])
        except CommandError as exc:
            return str(exc)
        return None

    with pool:
        results = list(pool.map(read, sorted(chosen)))
        errors = ["%s: %s" % (key, error) for key, consumer, said, error, shared_log in results if error]
        if errors:
            module.fail_json(msg="; ".join(errors), errors=errors)
        pending = [consumer["last_run"] for key, consumer, said, error, shared_log in results if shared_log]
        try:
            logs = host.logs(pending, params["log_lines"])
        except CommandError as exc:
            module.fail_json(msg=str(exc))
        for last in pending:
            last["log"] = logs.get(last["invocation_id"], [])
        # the runs a busier one crowded out of the shared read, each alone
        crowded_out = [last for last in pending if last["invocation_id"] and last["invocation_id"] not in logs]
        errors = [error for error in pool.map(read_log, crowded_out) if error]
    if errors:
        module.fail_json(msg="; ".join(errors), errors=errors)
    report = {key: consumer for key, consumer, said, error, shared_log in results}
    for name, (least, most) in counts.items():
        if least < most:
            report = dormant(report, name, least)
    for key, consumer, said, error, shared_log in results:
        for warning in said:
            module.warn(warning)
    module.exit_json(changed=False, consumers=report)


if __name__ == "__main__":
    main()
