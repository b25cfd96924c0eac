"""The host's budget (consumer_budget): one slice holds every consumer with
caps for all of them together, and at most running_max consumer units run
at once.

Five consumers get work at the same moment on each host: three drains and
two plain consumers whose timeout is shorter than their wait for a slot.
systemd is reloaded three times while they wait, as a deploy does. A
sampler on the host counts the batches that run every 100 ms. Judged from
the jobs each consumer wrote down, the sampler, consumer_info, the journal
and the metrics.
"""

import calendar
import json
import re
import shlex
import time

from testlib import (consumer_info, figure, on_every_host_at_once, scenario_vars, show, span_seconds, systemd_version,
                     wait_for)

DRAIN_JOBS, PLAIN_JOBS = 60, 10  # a drain's batches hold its slot for about 12 s
# (the elastic consumer is paused until test_elastic.py)
CONSUMERS = [consumer["name"] for consumer in scenario_vars()["consumer_list"] if consumer.get("state") != "paused"]
RUNNING_MAX = scenario_vars()["consumer_budget"]["running_max"]
SAMPLES = "/run/capacity-samples.json"
# Every 100 ms: how many consumer units run a batch of program (the cgroups of
# its processes: a shell's subshell is a copy of it; the runner, which names
# the program too, is not a batch).
SAMPLER = """
import json, os, sys, time
program = sys.argv[1].encode()
counts = []
while True:
    units = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == str(os.getpid()):
            continue  # /proc/self and this sampler name the program too
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                words = handle.read().split(b"\\0")
            if program not in words or any(word.endswith(b"/batchq-drain") for word in words):
                continue
            with open("/proc/%s/cgroup" % pid) as handle:
                units.add(next(line for line in handle if line.startswith("0::")))
        except (OSError, ValueError, StopIteration):
            pass
    counts.append(len(units))
    with open("/run/capacity-samples.json.new", "w") as out:
        json.dump(counts, out)
    os.rename("/run/capacity-samples.json.new", "/run/capacity-samples.json")
    time.sleep(0.1)
"""


def start_sampler(program):
    """The command that starts the sampler of program's batches."""
    return "systemd-run --quiet --unit=capacity-sampler --collect python3 -c %s %s" % (shlex.quote(SAMPLER), program)


def samples(host):
    """What the sampler counted, once it is stopped."""
    counted = json.loads(host.check_output("cat %s", SAMPLES))
    host.run("systemctl stop capacity-sampler")
    return counted


def jobs_of(name):
    return DRAIN_JOBS if name.startswith("drain") else PLAIN_JOBS


def queue(name):
    return "/var/lib/batchq/%s" % name


def give_every_consumer_work(host):
    """All jobs of all five queues, in one command; and the sampler started."""
    steps = [start_sampler("/usr/local/bin/capacity-batch")]
    for name in CONSUMERS:
        folder = queue(name)
        steps.append("rm -rf {0}/queued {0}/taken {0}/done && mkdir -p {0}/queued {0}/taken && touch {0}/done"
                     " && (cd {0}/queued && touch $(seq -f '{1}-%03g' 1 {2})) && chown -R batchq:batchq {0}"
                     .format(folder, name, jobs_of(name)))
    host.check_output("sh -c %s", " && ".join("{ %s; }" % step for step in steps))


def left(host):
    """{consumer: (jobs queued, jobs taken but not done)}."""
    found = {}
    for name in CONSUMERS:
        queued = int(host.check_output("ls %s/queued | wc -l", queue(name)))
        taken = int(host.check_output("ls %s/taken | wc -l", queue(name)))
        done = len(host.check_output("cat %s/done", queue(name)).split())
        found[name] = (queued, taken - done)
    return found


def waited_past_timeout(host):
    """Whether a plain consumer waits for a slot since longer than its timeout, by its StatusText."""
    timeout = span_seconds(scenario_vars()["consumer_list"][3]["timeout"])
    now = float(host.check_output("date +%s"))
    for name in ("plain-a", "plain-b"):
        status = host.check_output("systemctl show -P StatusText batchq-%s.service", name)
        since = re.match(r"waiting for a slot since (\S+ \S+) UTC", status)
        if since and now - calendar.timegm(time.strptime(since.group(1), "%Y-%m-%d %H:%M:%S")) > timeout + 1:
            return True
    return False


def slot_waits(host, name):
    """The waits the journal holds of a consumer's starts, in seconds."""
    out = host.check_output("journalctl --no-pager -o json -u batchq-%s.service MESSAGE_ID=%s", name,
                            "8a6b1f0c2d9e4b7a9c3e5f1a2b4c6d80")
    return [int(json.loads(line)["BATCHQ_SLOT_WAIT_USEC"]) / 1e6 for line in out.splitlines() if line.strip()]


@on_every_host_at_once
def test_the_slice_holds_every_consumer_with_the_budgets_caps(host):
    budget = scenario_vars()["consumer_budget"]
    version = int(host.check_output("systemctl --version").split()[1])
    properties = ["CPUQuotaPerSecUSec", "MemoryMax", "TasksMax"] + (["ConcurrencySoftMax"] if version >= 258 else [])
    wanted = {"CPUQuotaPerSecUSec": "1.500000s", "MemoryMax": str(1024 ** 3), "TasksMax": str(budget["tasks_max"])}
    if version >= 258:
        wanted["ConcurrencySoftMax"] = str(RUNNING_MAX)
    assert show(host, "batchq.slice", *properties) == wanted
    for name in CONSUMERS:
        assert show(host, "batchq-%s.service" % name, "Slice") == {"Slice": "batchq.slice"}, name


@on_every_host_at_once
def test_never_more_batches_at_once_than_the_budget_runs_and_every_job_done_once(host):
    give_every_consumer_work(host)
    began = time.time()
    try:
        # While the drains hold both slots, the others' starts wait: not failed, not lost.
        def seen_waiting():
            report = consumer_info(host, history=0, log_lines=0)["consumers"]
            states = {name: report[name]["state"] for name in CONSUMERS}
            return "waiting-for-slot" in states.values() and states
        states = wait_for(seen_waiting, 30, "a consumer waiting for a slot")
        # (a unit that starts or ends its run shows as running too: the sampler counts the batches)
        assert set(states.values()) <= {"running", "waiting-for-slot", "waiting"}, states
        # A deploy reloads systemd while starts wait. That re-arms a start timeout from the start of the
        # wait: a plain consumer that has waited longer than its timeout would fail at once. (From systemd
        # 258 on, a start waits in systemd's queue, before its unit starts.)
        if systemd_version(host) < 258:
            wait_for(lambda: waited_past_timeout(host), 60, "a plain consumer to wait longer than its timeout")
        for reload in range(3):
            assert host.run("systemctl daemon-reload").rc == 0, reload
        wait_for(lambda: all(counts == (0, 0) for counts in left(host).values()), 180, "every queue to drain",
                 interval=1)
        drained = time.time() - began
    finally:
        counted = samples(host)
    assert max(counted) == RUNNING_MAX, counted
    # the sampler ran through the drain: a sample at least every 0.3 s
    assert len(counted) >= drained / 0.3, (len(counted), drained)
    for name in CONSUMERS:
        done = host.check_output("cat %s/done", queue(name)).split()
        assert sorted(done) == ["%s-%03d" % (name, number) for number in range(1, jobs_of(name) + 1)], name
    figure("capacity: 5 consumers, %d jobs, at most %d batches at once on %s: drained in %.0f s, %d samples"
           % (3 * DRAIN_JOBS + 2 * PLAIN_JOBS, RUNNING_MAX, host.backend.get_hostname(), drained, len(counted)))


@on_every_host_at_once
def test_a_start_that_waited_for_a_slot_did_not_fail_and_its_wait_is_reported(host):
    # (after the drain above) every run succeeded, though the plain consumers waited longer than their timeout
    timeout = span_seconds(scenario_vars()["consumer_list"][3]["timeout"])
    report = consumer_info(host, history=20, log_lines=0)["consumers"]
    for name in CONSUMERS:
        assert report[name]["summary"]["failures"] == 0, (name, report[name])
    waits = {name: slot_waits(host, name) for name in CONSUMERS}
    assert max(waits["plain-a"] + waits["plain-b"]) > timeout, waits
    metrics = host.check_output("cat /var/lib/prometheus/node-exporter/batchq-plain-a.prom "
                                "/var/lib/prometheus/node-exporter/batchq-plain-b.prom")
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("batchq_consumer_slot_wait_seconds_total{"))
    # the metric counts every wait, the journal those of 0.1 s or more
    assert counted >= sum(waits["plain-a"] + waits["plain-b"]) - 0.001, (counted, waits)
    figure("capacity: the longest wait of a plain consumer for a slot on %s: %.1f s (timeout %.0f s)"
           % (host.backend.get_hostname(), max(waits["plain-a"] + waits["plain-b"]), timeout))
