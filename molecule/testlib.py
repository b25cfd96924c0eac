"""Helpers for the scenarios' testinfra tests: real hosts, real playbook runs.

Every wait is on a condition with a deadline; every failed assertion about a
consumer carries that consumer's journal, so a red run explains itself.
"""

import copy
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import testinfra
import yaml

# The tests' one wait, shared with tests/queues, tests/pgqueue and tests/unit (its folder).
sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "unit"))
import waiting  # noqa: E402  # pylint: disable=wrong-import-position

PREFIX = "batchq-"
INVENTORY = os.environ.get("MOLECULE_INVENTORY_FILE", "")
SCENARIO_DIR = pathlib.Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", "."))
# Variables files of the playbook runs; removed when the test run ends.
_VARS_DIR = tempfile.TemporaryDirectory(prefix="batchq-test-")


def scenario_vars():
    """The scenario's consumer variables, as converge deployed them."""
    return yaml.safe_load((SCENARIO_DIR / "group_vars" / "consumers.yml").read_text())


def consumer_spec(name):
    return next(c for c in scenario_vars()["consumer_list"] if c["name"] == name)


def all_hosts():
    """Every host of the scenario, for tests that deploy to all of them at once."""
    return testinfra.get_hosts(["ansible://all"], ansible_inventory=INVENTORY)


# The consumers whose timers the running test module WATCHES, and since when
# they run (conftest.py stops the others').
WATCHED = {"names": None, "since": 0.0}


SPAN_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def span_seconds(span):
    """A systemd time span of the scenarios in seconds: "1s", "100ms", "2min 30s", "1h"."""
    parts = re.findall(r"([0-9.]+)\s*([a-z]*)", str(span))
    assert parts, "not a time span: %r" % (span,)
    return sum(float(number) * SPAN_UNITS[unit or "s"] for number, unit in parts)


def timers_of(consumer):
    """The timer units of a consumer of the scenario: one per instance."""
    instances = int(consumer.get("instances", 1))
    if instances > 1:
        return ["%s%s@%d.timer" % (PREFIX, consumer["name"], i) for i in range(1, instances + 1)]
    return ["%s%s.timer" % (PREFIX, consumer["name"])]


def watched_since():
    """When the consumers the test module watches began to run: their records
    before it may have gaps of minutes, while other modules ran."""
    return WATCHED["since"]


# A wait asks a host twice a second unless it says otherwise: each question
# costs the host and the 2-core machine a command (CONTRIBUTING.md, Tests).
HOST_POLL = 0.5
wait_for = functools.partial(waiting.wait_for, interval=HOST_POLL)


def side_by_side(check, cases, label=None):
    """Run check(case) for every case at once, a thread each, and return the
    results in order. Cases on separate hosts, or separate consumers of one
    host, wait on their own timers. One after another, their waits add up.
    Fails with the failure of every case, each under its label (a host's name,
    or str(case)). A skip inside check counts as a failure."""
    label = label or (lambda case: case.backend.get_hostname() if hasattr(case, "backend") else str(case))
    assert cases, "no cases to run"
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = [pool.submit(check, case) for case in cases]
    failures = ["%s: %s" % (label(case), "".join(traceback.format_exception(future.exception())[-3:]).strip())
                for case, future in zip(cases, futures) if future.exception() is not None]
    assert not failures, "\n\n".join(failures)
    return [future.result() for future in futures]


def on_every_host_at_once(check):
    """Decorator: a test of one host, check(host), run on every host side by
    side as one test (hosts). For a test that mostly waits on the host's own
    timers, so that the waits of the hosts overlap."""
    def test(hosts):
        side_by_side(check, hosts)
    # not functools.wraps: pytest would read check's signature (host) through __wrapped__
    test.__name__, test.__qualname__, test.__doc__ = check.__name__, check.__qualname__, check.__doc__
    test.__module__ = check.__module__
    return test


def journal(host, name, lines=80):
    """The tail of a consumer's journal (all its units and instances)."""
    out = host.run("journalctl --no-pager -o short-precise -n %s -u %s", str(lines), PREFIX + name + "*")
    return "\n--- journal of %s on %s ---\n%s" % (name, host.backend.get_hostname(), out.stdout)


def runs(host, name):
    """A consumer's runs from the probe's own records, oldest first.

    Each run is the start record with "end" (time) and "status" added once the
    run recorded its end.
    """
    out = host.run("cat /var/lib/batchq/%s/runs.jsonl 2>/dev/null || true", name)
    by_invocation = {}
    for line in out.stdout.splitlines():
        record = json.loads(line)
        run = by_invocation.setdefault(record["invocation"], {})
        if record["event"] == "start":
            run.update(record, start=record["time"])
        elif record["event"] == "end":
            run.update(record, end=record["time"])
        else:  # anything a run records on its way, e.g. the children it forked
            run.update({key: value for key, value in record.items() if key not in ("event", "time")})
    return sorted((r for r in by_invocation.values() if "start" in r), key=lambda r: r["start"])


FIGURES = []


def figure(text):
    """A measured figure for the README; conftest prints them all at the end of the run."""
    FIGURES.append(text)


def finished(runs_):
    return [r for r in runs_ if "end" in r]


def show(host, unit, *properties):
    """systemctl show of a unit (of the manager for unit None) as a dict,
    timestamps in UTC with microseconds."""
    asked = list(properties) + [p + "Monotonic" for p in properties if p.endswith("Timestamp")]
    command = "systemctl show --timestamp=us+utc --property=%s" % ",".join(asked)
    out = host.check_output(command + (" %s" if unit else ""), *([unit] if unit else []))
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    for name in properties:
        # systemd 247 ignores --timestamp in show: whole seconds. Its monotonic
        # twin, taken at the same instant, gives the microseconds.
        if name.endswith("Timestamp") and values.get(name) and "." not in values[name]:
            values[name] = _utc_text(realtime_of(host, int(values[name + "Monotonic"])))
    return {name: values.get(name, "") for name in properties}


def realtime_of(host, monotonic_usecs):
    """Seconds since the epoch of a CLOCK_MONOTONIC time of host, in microseconds."""
    now, monotonic = map(float, host.check_output(
        "python3 -c 'import time; print(time.time(), time.monotonic())'").split())
    return now - (monotonic - monotonic_usecs / 1e6)


def _utc_text(seconds):
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%a %Y-%m-%d %H:%M:%S.%f UTC")


def timestamp(text):
    """Seconds since the epoch of a systemd timestamp like 'Sun 2026-11-29 11:25:05.123456 UTC'."""
    return datetime.strptime(text, "%a %Y-%m-%d %H:%M:%S.%f UTC").replace(tzinfo=timezone.utc).timestamp()


def timestamp_of(iso_text):
    """Seconds since the epoch of an ISO 8601 time as consumer_info reports it."""
    return datetime.fromisoformat(iso_text.replace("Z", "+00:00")).timestamp()


# systemd's "Main process exited" (consumer_runs.PROCESS_EXITED)
PROCESS_EXITED = "98e322203f7a4ed290d09fe03c09fe15"
# systemd's "Starting UNIT..." (SD_MESSAGE_UNIT_STARTING)
UNIT_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"


def exits(host, unit):
    """{invocation: when systemd saw its main process exit} of unit's runs, by
    systemd's own clock (journald may receive the message later)."""
    out = host.check_output("journalctl --no-pager -o json --output-fields=INVOCATION_ID,_SOURCE_REALTIME_TIMESTAMP "
                            "UNIT=%s MESSAGE_ID=%s", unit, PROCESS_EXITED)
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {e["INVOCATION_ID"]: int(e.get("_SOURCE_REALTIME_TIMESTAMP", e["__REALTIME_TIMESTAMP"])) / 1e6
            for e in entries if "INVOCATION_ID" in e}


def host_state(host):
    """What a deploy may change on a host: unit files with their content,
    symlinks, the consumer account and whether each timer is active (not its
    sub-state, which flips while batches run)."""
    return host.check_output(
        "cd /etc/systemd/system && "
        "find . -name '%s*' -printf '%%p -> %%l\\n' | sort && "
        "find . -name '%s*' -type f -exec md5sum {} + | sort && "
        "(getent passwd batchq || true) && "
        "systemctl list-units --all --plain --no-legend --type=timer '%s*' | awk '{print $1, $2, $3}'",
        PREFIX, PREFIX, PREFIX)


def deploy(consumer_list=None, check=False, background=False, verbose=False, **extra):
    """Run the deploy playbook as a user would; returns the finished process
    (or the running one with background=True)."""
    variables = scenario_vars()
    if consumer_list is not None:
        variables["consumer_list"] = consumer_list
    variables.update(extra)
    with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=_VARS_DIR.name, delete=False) as handle:
        yaml.safe_dump(variables, handle)
    argv = ["ansible-playbook", "batchq.consumers.deploy_consumers", "-i", INVENTORY, "-e", "@" + handle.name]
    if check:
        argv += ["--check", "--diff"]
    if verbose:
        argv += ["--diff", "-vv"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if background:
        return process
    process.output = process.communicate(timeout=900)[0]
    return process


def control(action, *extra, inventory=None, playbook="batchq.consumers.consumer_control"):
    """Run consumer_control.yml as a user would, with consumer_action=action and
    extra arguments of ansible-playbook (e.g. "-e", "consumer_names=a,b"), on the
    scenario's inventory or another; playbook: consumer_status.yml, say.
    Returns (returncode, output)."""
    process = subprocess.run(["ansible-playbook", playbook, "-i", inventory or INVENTORY,
                              "-e", "consumer_action=" + action, *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900, check=False)
    return process.returncode, process.stdout


def control_said(output, what):
    """{host: [unit, ...]} that a run of consumer_control.yml says it acted on,
    host by host. what names a part of each host's message: in "started now: a b;
    left alone, a batch is running: c", "started now" gives a and b, and "left
    alone, a batch is running" gives c. A host that said "none" there has []; a
    host that said nothing of it is absent."""
    found, host = {}, None
    for line in output.splitlines():
        result = re.match(r"(?:ok|changed): \[([^\]]+)\]", line)
        host = result.group(1) if result else host
        if host and what + ":" in line:
            listed = line.split(what + ":", 1)[1].split(";")[0].strip().strip('"')
            found.setdefault(host, []).extend([] if listed.startswith("none") else listed.split())
    return found


def consumers(**changes):
    """The scenario's consumer list with fields of some consumers changed."""
    result = copy.deepcopy(scenario_vars()["consumer_list"])
    for consumer in result:
        consumer.update(changes.get(consumer["name"], {}))
    return result


def assert_deployed(process):
    assert process.returncode == 0, process.output


# The scenarios' "long" consumer holds its batch until the test releases it,
# so "still running" is a fact the test controls, not a race against the clock.
def start_held_batch(hosts, tag):
    for host in hosts:
        host.check_output("rm -f /var/lib/batchq/long/release && systemctl start --no-block batchq-long.service")
    for host in hosts:
        wait_for(lambda: [r for r in runs(host, "long") if r["tag"] == tag and "end" not in r],
                 30, "a running %s batch of long on %s" % (tag, host.backend.get_hostname()))


def release_batch(hosts, tag):
    for host in hosts:
        host.check_output("touch /var/lib/batchq/long/release")
    for host in hosts:
        run = wait_for(lambda: [r for r in finished(runs(host, "long")) if r["tag"] == tag],
                       30, "the end of the %s batch" % tag)[-1]
        assert run["status"] == 0, journal(host, "long")
        # The probe writes its end a moment before it exits, and ExecStopPost=
        # runs after that: a start asked for while the unit is still activating
        # is taken as done by the running batch. Wait until the run has ended.
        wait_for(lambda: show(host, "batchq-long.service", "ActiveState")["ActiveState"] in ("inactive", "failed"),
                 30, "batchq-long.service to end its %s run" % tag)


def release_held(hosts):
    """Let a held batch go, so that a failed test does not hold the next one up."""
    for host in hosts:
        host.run("[ \"$(systemctl show -P ActiveState batchq-long.service)\" = activating ] "
                 "&& touch /var/lib/batchq/long/release")


def assert_running(hosts):
    for host in hosts:
        state = show(host, "batchq-long.service", "ActiveState")["ActiveState"]
        assert state == "activating", "batch is %s%s" % (state, journal(host, "long"))


def redeploy_during_a_held_batch(hosts):
    """Deploy a changed command while a batch runs: it finishes (its own end
    record is written) and the next run uses the new command."""
    start_held_batch(hosts, "v1")
    changed = consumers(long={"command": "/usr/local/bin/batchq-probe run --hold --tag v2"})
    assert_deployed(deploy(changed))
    assert_running(hosts)
    release_batch(hosts, "v1")
    start_held_batch(hosts, "v2")
    release_batch(hosts, "v2")
    assert_deployed(deploy())  # back to v1 for the tests that follow


def restart(host):
    """Restart the host's container; returns when its new systemd started, by
    systemd's clock. Not when the boot finished: on a loaded CI machine a host
    full of short batches stayed "starting" for over 240 s (likely because
    systemd counts a boot finished only once no job is queued, and each batch
    is a job). The new manager answering is what the tests need."""
    name = host.backend.get_hostname()
    restarted_at = time.time()
    subprocess.run(["docker", "restart", name], check=True, stdout=subprocess.DEVNULL, timeout=120)

    def booted():
        try:
            started = timestamp(show(host, None, "UserspaceTimestamp")["UserspaceTimestamp"])
        except (AssertionError, RuntimeError, ValueError):  # the container is still restarting
            return None
        return started > restarted_at and started

    return wait_for(booted, 120, "the systemd of %s to start again" % name)


def _manager_time(entry):
    """When systemd wrote a journal entry, by its own clock (journald may read it later)."""
    return int(entry.get("_SOURCE_REALTIME_TIMESTAMP", entry["__REALTIME_TIMESTAMP"])) / 1e6


def started(host, unit):
    """When systemd finished each start job of unit, seconds since the epoch,
    oldest first."""
    out = host.check_output("journalctl --no-pager -o json --output-fields=JOB_TYPE,JOB_RESULT,_SOURCE_REALTIME_TIMESTAMP "
                            "UNIT=%s", unit)
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [_manager_time(e) for e in entries if e.get("JOB_TYPE") == "start" and e.get("JOB_RESULT") == "done"]


def due_after_boot(host, timer, booted, delay):
    """When timer (OnBootSec=delay) is due after the boot at booted: delay
    after the boot, or at once when the timer itself starts later, as on a
    loaded CI machine that reached the timers 11.6 s after boot."""
    def entered_active():
        # systemd's own record, not the journal's: on a loaded CI machine the
        # journal once had no "start job done" entry of the timer after boot
        text = show(host, timer, "ActiveEnterTimestamp")["ActiveEnterTimestamp"]
        return text and timestamp(text) > booted and timestamp(text)

    return max(booted + delay, wait_for(entered_active, 60, "the start of %s after the boot" % timer))


def scheduled_starts(host, timer):
    """When the role scheduled the start of timer (its transient starter was
    started), seconds since the epoch, oldest first."""
    return started(host, timer[:-len(".timer")].replace("@", ".") + ".start.timer")


def activations(host, unit):
    """When systemd began each start of unit ("Starting ..."), seconds since
    the epoch, oldest first: the moment its timer fired, before the
    process starts, which takes seconds more on a loaded machine."""
    out = host.check_output("journalctl --no-pager -o json --output-fields=_SOURCE_REALTIME_TIMESTAMP "
                            "UNIT=%s MESSAGE_ID=%s", unit, UNIT_STARTING)
    return [_manager_time(json.loads(line)) for line in out.splitlines() if line.strip()]


def memory_kill_result(host):
    """The Result systemd gives a batch killed for memory_max on this host.

    systemd learns of an OOM kill from the unified hierarchy's memory.events;
    where the memory controller sits in a v1 hierarchy (v1 or hybrid setup)
    it only sees the SIGKILL.
    """
    if host.check_output("stat -fc %T /sys/fs/cgroup") == "cgroup2fs":
        return "oom-kill"  # pure v2: the memory controller can only be there
    # /proc/cgroups: subsys_name hierarchy num_cgroups enabled; hierarchy 0 means not on v1
    v1 = host.check_output("awk '$1 == \"memory\" && $4 == 1 {print $2}' /proc/cgroups")
    return "signal" if v1 not in ("", "0") else "oom-kill"


def ansible_module(host, module, arguments="", *extra):
    """Run a module on one host with the ansible CLI, e.g. as another remote user
    (extra: more CLI arguments). Returns (returncode, output)."""
    process = subprocess.run(
        ["ansible", host.backend.get_hostname(), "-i", INVENTORY, "-m", module, "-a", arguments, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    return process.returncode, process.stdout


def consumer_info(host, **options):
    """The module's report of host, run through ansible as a user would."""
    arguments = " ".join("%s=%s" % item for item in options.items())
    result = host.ansible("batchq.consumers.consumer_info", arguments, check=False)
    assert result.get("failed") is not True, result
    return result


def systemd_version(host):
    """The host's systemd release, e.g. 247 (`systemctl --version`: "systemd 247 (247.3-7+deb11u5)")."""
    return int(host.check_output("systemctl --version").split()[1])


def next_elapse(host, timer):
    """NEXT of list-timers, 'Sun 2026-11-29 12:58:26 UTC' in the host's zone (UTC), in seconds."""
    listed = host.check_output("systemctl list-timers --all --no-legend %s", timer).split()
    return timestamp("%s %s %s.0 UTC" % tuple(listed[:3]))


_FETCH = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics', timeout=10).read().decode())"


def scrape(host):
    """node_exporter's page on the host, {(metric, sorted label pairs): value};
    127.0.0.1, not localhost: that may be ::1 where IPv6 is off."""
    def fetch():
        out = host.run("python3 -c %s", _FETCH)
        return out.rc == 0 and out.stdout

    series = {}
    for line in wait_for(fetch, 30, "node_exporter to answer on %s" % host.backend.get_hostname()).splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, labels = (name_labels + "{").split("{")[:2]
        series[(name, tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))))] = float(value)
    return series


def consumer_series(series, name, metric, **labels):
    """The values of one batchq_consumer_* metric of consumer name, {unit or (unit, result): value}."""
    found = {}
    for (metric_name, pairs), value in series.items():
        found_labels = dict(pairs)
        if metric_name != "batchq_consumer_" + metric or found_labels.get("consumer") != name:
            continue
        if any(found_labels.get(k) != v for k, v in labels.items()):
            continue
        key = found_labels["unit"] if "result" not in found_labels or "result" in labels else (
            found_labels["unit"], found_labels["result"])
        found[key] = value
    return found
