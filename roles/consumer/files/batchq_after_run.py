# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After each run of a consumer: its Prometheus metrics and its failure hooks.

Usage (the unit's ExecStopPost=, as root, outside the sandbox):
    batchq_after_run.py --spec SPEC_PATH --unit UNIT
and, in a hook's own transient unit:
    batchq_after_run.py --run-hook

SPEC_PATH is the consumer's runtime spec (JSON, written by the role; see
consumer_protocol.read_spec). It says where the metrics go (metrics_folder;
none: no metrics), which failure hooks run (hooks) and which credentials
their units load (hook_credentials).

How the run ended comes from systemd: SERVICE_RESULT, EXIT_CODE, EXIT_STATUS
and INVOCATION_ID (all there for ExecStopPost= since systemd 232), its times
from `systemctl show`. A drain writes its metrics after each batch itself
(batchq-drain); its failed batch is always the last of its run, so its hooks
are run from here too. The spec's services are the consumer's units now: the
series of any other unit are dropped from its file.

systemd runs this within the unit's stop timeout and cgroup limits: every
command and lock here has a deadline (DEADLINE), so that it can never hold
the unit in "deactivating" or turn the run's result into a timeout.

A hook never runs in the consumer's unit: it is started with `systemd-run
--no-block` as a transient unit of its own, limited to EVERY (or 1 min), so
it cannot delay, block or kill a batch, and its failure is its own; the
consumer's hook_credentials are loaded into that unit alone, files in its
$CREDENTIALS_DIRECTORY (LoadCredential=, or LoadCredentialEncrypted= when the
role encrypted them), never in its environment or a unit file. At most
one on_failure per consumer per EVERY while failures go on (EVERY between the
ends of the runs told, as systemd recorded them), each saying how many
failures it covers; the first failure after a success notifies at once.
The state is /var/lib/batchq-hooks/<consumer>.json (root's; it survives
reboots). Nothing here can fail the run: errors are printed, the exit status is 0.
"""

import json
import os
import subprocess
import sys
import time

# The run protocol and the metrics writer, installed beside this file: this
# runs isolated (python3 -I), with no script folder in sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import consumer_protocol as protocol  # noqa: E402 pylint: disable=wrong-import-position

STATE_DIR = "/var/lib/batchq-hooks"
LOG_LINES = 20
C_ENV = {"LANG": "C", "LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
DEADLINE = 5.0


def hook_decision(state, unit, failed, now, every):
    """The consumer's hook state after one run of unit (one of its instances),
    and which hook to run with how many failures: (state, None) or
    (state, ("on_failure" or "on_recovery", failures)).

    An episode of failures begins with a failure of a healthy consumer, told at
    once, and ends when it is healthy again: the last run of every instance
    that failed in it has succeeded. While it goes on, at most one on_failure
    per `every`, whichever instance fails: a poison job that crashes each
    instance in turn is one episode. A consumer that fails and succeeds by
    turns is told each time (see the README)."""
    pending, episode = state.get("pending", 0), state.get("episode", 0)
    notified_at = state.get("notified_at")
    failing = set(state.get("failing", []))
    if failed:
        failing.add(unit)
        if notified_at is None or now - notified_at >= every:
            return ({"pending": 0, "episode": episode + 1, "notified_at": now, "failing": sorted(failing)},
                    ("on_failure", pending + 1))
        return {"pending": pending + 1, "episode": episode + 1, "notified_at": notified_at,
                "failing": sorted(failing)}, None
    failing.discard(unit)
    if failing:  # another instance's last run failed: the episode goes on
        return dict(state, failing=sorted(failing)), None
    if episode:
        return {}, ("on_recovery", episode)
    return {}, None


def hook_unit(unit, kind, invocation):
    """batchq-x@2.service -> batchq-x.2.on-failure.<invocation>.service: no "@",
    and a dot after the name, so nothing takes it for a consumer's unit."""
    stem = unit[:-len(".service")] if unit.endswith(".service") else unit
    return "%s.%s.%s.service" % (stem.replace("@", "."), kind.replace("_", "-"), invocation or int(time.time()))


def _last_run(unit):
    """Start and end of the unit's last run, in time.time() terms, and the
    journal matches of the lines of its last batch (see batch_matches)."""
    output = subprocess.run(
        ["systemctl", "show", unit, "--property=InactiveExitTimestampMonotonic",
         "--property=ExecMainStartTimestampMonotonic", "--property=ExecMainExitTimestampMonotonic",
         "--property=ExecMainPID", "--property=StatusText", "--property=ExecStart"],
        stdout=subprocess.PIPE, check=True, env=C_ENV, timeout=DEADLINE).stdout.decode("utf-8", "replace")
    fields = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    usec = {key: int(fields.get(key) or 0) for key in
            ("InactiveExitTimestampMonotonic", "ExecMainStartTimestampMonotonic", "ExecMainExitTimestampMonotonic")}
    activated = usec["InactiveExitTimestampMonotonic"]
    # A start that failed before exec keeps the previous run's exec times.
    started = max(activated, usec["ExecMainStartTimestampMonotonic"])
    now_mono, now = time.monotonic(), time.time()
    ended = usec["ExecMainExitTimestampMonotonic"]
    end = now if ended < started else now - (now_mono - ended / 1e6)
    # (systemd stamps the exec start a moment before the activation's own start)
    ran = ended >= activated
    matches = batch_matches(fields.get("ExecStart", ""), fields.get("ExecMainPID", ""),
                            fields.get("StatusText", "")) if ran else []
    return (now - (now_mono - started / 1e6) if started else end), end, matches


def batch_matches(exec_start, main_pid, status_text):
    """The journal matches, besides the run's invocation, of the lines of a
    drain's last batch (see protocol.batch_journal_matches). None for a run
    that is not a drain's: all its lines."""
    batch = protocol.parse_status_text(status_text)
    if protocol.RUNNER_IDENTIFIER not in exec_start or not main_pid.isdigit() or batch is None:
        return []
    return protocol.batch_journal_matches(main_pid, batch)


def _batchq_metrics():
    """batchq_metrics.py, installed beside this file; loaded only when needed."""
    import batchq_metrics  # pylint: disable=import-outside-toplevel
    return batchq_metrics


def write_metrics(unit, times, spec):
    batchq_metrics = _batchq_metrics()
    started, ended = times[:2]
    run = {
        "result": os.environ.get("SERVICE_RESULT", "success"),
        "status": protocol.exit_status_number(protocol.exit_status(os.environ.get("EXIT_CODE", ""),
                                                                   os.environ.get("EXIT_STATUS"))),
        "started": round(started, 6), "ended": round(ended, 6),
    }
    batchq_metrics.update(spec["metrics_folder"], spec["consumer"], unit, run, spec["interval_usec"] / 1e6,
                          spec["timeout_usec"] / 1e6, tuple(spec["services"]))


def credential_properties(credentials):
    """systemd-run properties that give a hook's unit the consumer's hook_credentials
    (the spec's: encrypted or not, and NAME:PATH of each), or none."""
    if not credentials:
        return []
    setting = "LoadCredentialEncrypted" if credentials["encrypted"] else "LoadCredential"
    return ["--property=%s=%s" % (setting, pair) for pair in credentials["load"]]


def write_over(descriptor, data):
    """Write data over the file's content, then cut the file to data's length.
    The write pads data with spaces to the file's old size, and JSON allows
    them: a run killed between the two steps (a reboot) leaves the old state
    or the new one. A truncate first would leave an empty file for a moment,
    and an empty file is no state: every failure count starts again."""
    os.pwrite(descriptor, data.ljust(os.fstat(descriptor).st_size), 0)
    os.ftruncate(descriptor, len(data))


def run_hooks(unit, times, spec):
    consumer, hooks = spec["consumer"], spec["hooks"]
    every = hooks["every_usec"] / 1e6
    failed = os.environ.get("SERVICE_RESULT", "success") not in protocol.SUCCESSES
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    path = os.path.join(STATE_DIR, consumer + ".json")
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(descriptor, "r+", encoding="utf-8") as handle:
        # Instances of one consumer share the state: one at a time.
        _batchq_metrics().lock(handle.fileno(), DEADLINE)
        try:
            state = json.loads(handle.read() or "{}")
        except ValueError:
            state = {}
        # the run's end, not this writer's clock: how long it took to get
        # here (seconds on a loaded host) must not move the period
        state, hook = hook_decision(state, unit, failed, times[1], every)
        write_over(handle.fileno(), json.dumps(state).encode("utf-8"))
    argv = hooks[hook[0]] if hook else None
    if not argv:
        return
    kind, failures = hook
    invocation = os.environ.get("INVOCATION_ID", "")
    environment = {
        "BATCHQ_HOOK": json.dumps(argv), "BATCHQ_EVENT": kind.replace("_", "-"), "BATCHQ_CONSUMER": consumer,
        "BATCHQ_UNIT": unit, "BATCHQ_RESULT": os.environ.get("SERVICE_RESULT", ""),
        "BATCHQ_EXIT_CODE": os.environ.get("EXIT_CODE", ""), "BATCHQ_EXIT_STATUS": os.environ.get("EXIT_STATUS", ""),
        "BATCHQ_INVOCATION_ID": invocation, "BATCHQ_FAILURES": str(failures),
        "BATCHQ_LOG_MATCHES": json.dumps(times[2]),
    }
    # Values go over D-Bus as they are: systemd expands nothing in them.
    subprocess.run(
        ["systemd-run", "--quiet", "--no-block", "--collect", "--unit=" + hook_unit(unit, kind, invocation),
         "--description=%s of batchq consumer %s" % (kind, consumer),
         "--property=RuntimeMaxSec=%d" % max(1, int(every) if every else 60)]
        # its secrets as files in its own $CREDENTIALS_DIRECTORY, never in its environment
        + credential_properties(spec["hook_credentials"])
        + ["--setenv=%s=%s" % pair for pair in sorted(environment.items())]
        + ["/usr/bin/python3", "-I", os.path.abspath(__file__), "--run-hook"],
        check=True, env=C_ENV, timeout=DEADLINE)


def batch_log(invocation, matches):
    """The last lines of the run's failed batch: for a drain, the last batch's
    own lines only (matches, from batch_matches), not the runner's records."""
    out = subprocess.run(["journalctl", "--no-pager", "--quiet", "--output=json",
                          "--output-fields=MESSAGE,SYSLOG_IDENTIFIER", "--lines=%d" % (LOG_LINES + 1),
                          "_SYSTEMD_INVOCATION_ID=" + invocation] + matches,
                         stdout=subprocess.PIPE, check=False, env=C_ENV).stdout.decode("utf-8", "replace")
    lines = []
    for line in out.splitlines():
        entry = json.loads(line) if line.strip() else {}
        message = entry.get("MESSAGE")
        if message is None or (matches and entry.get("SYSLOG_IDENTIFIER") == protocol.RUNNER_IDENTIFIER):
            continue
        lines.append(bytes(message).decode("utf-8", "replace") if isinstance(message, list) else message)
    return "".join(text + "\n" for text in lines[-LOG_LINES:])


def run_hook():
    """In the hook's transient unit: add the failed batch's log, then become the hook."""
    environment = dict(os.environ)
    argv = json.loads(environment.pop("BATCHQ_HOOK"))
    matches = json.loads(environment.pop("BATCHQ_LOG_MATCHES", "[]"))
    if environment.get("BATCHQ_EVENT") == "on-failure" and environment.get("BATCHQ_INVOCATION_ID"):
        environment["BATCHQ_LOG"] = batch_log(environment["BATCHQ_INVOCATION_ID"], matches)
    os.execve(argv[0], argv, environment)


def main(args):
    if args == ["--run-hook"]:
        return run_hook()
    if len(args) != 4 or args[0] != "--spec" or args[2] != "--unit":
        sys.stderr.write("usage: batchq_after_run.py --spec SPEC_PATH --unit UNIT | --run-hook\n")
        return 0
    unit = args[3]
    try:
        spec = protocol.read_spec(args[1])
    except protocol.SpecError as exc:
        sys.stderr.write("batchq_after_run: %s\n" % exc)
        return 0
    try:
        times = _last_run(unit)
    except Exception as exc:  # pylint: disable=broad-except
        sys.stderr.write("batchq_after_run: times of %s unknown: %s\n" % (unit, exc))
        times = (time.time(), time.time(), [])
    # A runner (a drain's, or a plain consumer's that waits for a slot) writes its metrics after each batch itself.
    writes_metrics = spec["metrics_folder"] and not spec["runner"]
    for what, action in (("metrics", write_metrics if writes_metrics else None),
                         ("hooks", run_hooks if spec["hooks"] else None)):
        if action:
            try:
                action(unit, times, spec)
            except Exception as exc:  # pylint: disable=broad-except
                sys.stderr.write("batchq_after_run: %s of %s failed: %s\n" % (what, unit, exc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
