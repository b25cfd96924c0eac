"""The reference consumer of a directory of files (examples/spool_queue), two
instances on one spool per host: every file ends in done/ with its own
digest, done by one batch only (the consumer's records say which, and the
result names it: a result is never replaced), a batch at its timeout stops
the work at hand, keeps what it finished and gives the rest back, and
files that fail every attempt (an error, or a crash of the work's process)
end in failed/ after exactly their attempts.
Judged from the spool itself, against the digests of the files as they were
enqueued, taken (by sha256sum) before a consumer saw them, and from the
consumer's records. test_then_reboot.py restarts the hosts in the middle of
a spool drain."""

import json
import time

from test_drain import idle
from testlib import consumer_spec, journal, scenario_vars, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py); the others wait.
WATCHES = ("spool",)

SPOOL = scenario_vars()["spool_dir"]
UNITS = ["batchq-spool@1", "batchq-spool@2"]
MAX_ATTEMPTS = 3  # the consumer's --max-attempts
# the runner's record of a batch's end (batchq-drain BATCH_END)
BATCH_END = "4f3c5a1e9b6d4c0e8a2f7b9d1e3c5a70"


def stats(host):
    return json.loads(host.check_output("batchq-spool-enqueue --stats --spool %s", SPOOL))


def digests(host, folder):
    """{name: sha256} of the files in a folder of the spool, by coreutils."""
    out = host.check_output("cd %s/%s && find . -maxdepth 1 -type f -printf '%%f\\0' | xargs -0r sha256sum",
                            SPOOL, folder)
    return {name: digest for digest, name in (line.split("  ", 1) for line in out.splitlines())}


def results(host):
    """{name: result} of done/, the consumer's results."""
    script = ("import json, os, sys\n"
              "for name in os.listdir(sys.argv[1]):\n"
              "    with open(os.path.join(sys.argv[1], name)) as f:\n"
              "        print(json.dumps([name, json.load(f)]))\n")
    out = host.check_output("python3 -c %s %s/done", script, SPOOL)
    return dict(json.loads(line) for line in out.splitlines())


def records(host):
    """The consumer's own records, oldest first."""
    out = host.run("cat /var/lib/batchq/spool/batches.jsonl.1 /var/lib/batchq/spool/batches.jsonl 2>/dev/null")
    return [json.loads(line) for line in out.stdout.splitlines()]


def hold(host):
    """Stop both instances' timers and wait out their batches: no file is taken meanwhile."""
    host.check_output("systemctl stop " + " ".join(unit + ".timer" for unit in UNITS))
    wait_for(lambda: all(idle(host, unit + ".service") for unit in UNITS), 60,
             "the spool consumers of %s to be idle" % host.backend.get_hostname())


def release(host):
    # (the unit names are the test's own words, no quoting needed)
    host.check_output("systemctl start %s && systemctl start --no-block %s" % (
        " ".join(unit + ".timer" for unit in UNITS), " ".join(unit + ".service" for unit in UNITS)))


def enqueue(host, *calls):
    """Enqueue while no consumer runs; returns the digests of what incoming/ then holds."""
    hold(host)
    host.check_output(" && ".join("batchq-spool-enqueue %s --spool %s" % (call, SPOOL) for call in calls))
    enqueued = digests(host, "incoming")
    release(host)
    return enqueued


def drained(host, done, failed):
    now = stats(host)
    return (now["incoming"] == now["claims"] == now["tmp"] == 0 and now["done"] == done
            and now["failed"] == failed and now)


def doers(host, since=0):
    """{file: [(batch, attempt), ...]}: the batches that did each file, by the
    consumer's records since a time: the "done" of each batch that ended; of
    one killed, what it claimed less what the takeover of its claim found
    there unfinished (which may include a file that failed and was put back)."""
    ours = [r for r in records(host) if r["time"] > since]
    ended = {r["batch"]: r for r in ours if r["event"] == "end"}
    unfinished = {t["folder"]: t["counted"] + t["refunded"] + t["failed"]
                  for r in ours if r["event"] == "claim" for t in r["taken_back"]}
    did = {}
    for claim in (r for r in ours if r["event"] == "claim"):
        end = ended.get(claim["batch"])
        names = end.get("done", []) if end else [n for n in claim["names"] if n not in unfinished.get(claim["folder"], [])]
        for name in names:
            base, attempt = name.rsplit("~", 1)
            did.setdefault(base, []).append((claim["batch"], int(attempt)))
    return did


def assert_each_done_once(host, enqueued, failing=(), since=0):
    """Every file enqueued is in done/ with its own digest, done by one batch
    (the one its result names), or in failed/ after MAX_ATTEMPTS."""
    done = results(host)
    wanted = {name: digest for name, digest in enqueued.items() if name not in failing}
    assert {name: done.get(name, {}).get("sha256") for name in wanted} == wanted, journal(host, "spool")
    # No batch did a file another had done (a redo: its result would be
    # found there, and kept), nor a killed one a file it had finished.
    assert not [r["redone"] for r in records(host) if r["event"] == "end" and r["time"] > since and r.get("redone")]
    did = doers(host, since)
    twice = {name: did.get(name) for name in wanted if len(did.get(name, [])) != 1}
    assert not twice, twice
    assert {name: (done[name]["by"], done[name]["attempt"]) for name in wanted} == {
        name: did[name][0] for name in wanted}
    failed = digests(host, "failed")
    assert {name: failed.get("%s~%d" % (name, MAX_ATTEMPTS)) for name in failing} == {
        name: enqueued[name] for name in failing}, (sorted(failed), journal(host, "spool"))
    now = stats(host)
    assert now["incoming"] == now["claims"] == now["tmp"] == 0, now
    return {name: done[name] for name in wanted}


def takebacks(host, name):
    """(time, the taking batch, what it took) of each claim folder taken back that was at the file name."""
    return [(r["time"], r["batch"], taken) for r in records(host) if r["event"] == "claim"
            for taken in r["taken_back"] if taken["working"].split("~")[0] == name]


def test_two_instances_drain_5000_files_each_once_through_a_timeout_and_poison(hosts):
    assert "--max-attempts %d" % MAX_ATTEMPTS in consumer_spec("spool")["command"]
    crash, fail, slow = "b-crash-000001.json", "b-fail-000001.json", "b-slow-000001.json"
    enqueued, before = {}, {}
    for host in hosts:
        before[host] = stats(host)
        # the poison sorts between a- and c-: it comes in the middle of the drain
        enqueued[host] = enqueue(host, "2500 --prefix a", "1 --prefix b-crash --crash", "1 --prefix b-fail --fail",
                                 "1 --prefix b-slow --sleep 30 --sleep-attempts 1", "2500 --prefix c")
        assert len(enqueued[host]) == 5003
    for host in hosts:
        name = host.backend.get_hostname()
        # three failed attempts of each poison file, each followed by the interval and its backoff
        wait_for(lambda: drained(host, before[host]["done"] + 5001, before[host]["failed"] + 2), 300,
                 "the spool of %s to drain%s" % (name, journal(host, "spool")))
        done = assert_each_done_once(host, enqueued[host], failing=(crash, fail))
        assert {result["by"].split("/")[1] for result in done.values()} == {"spool@1", "spool@2"}, "one instance idled"

        # the slow file outlived its batch's timeout: the runner's SIGTERM reached its work (the
        # queue library passes it on), and the batch ended before the SIGKILL that comes
        # stop_timeout later: a batch killed by it writes no end record
        assert done[slow]["attempt"] == 2, done[slow]
        timed_out = host.check_output(
            "journalctl --no-pager -o cat -u 'batchq-spool@*' MESSAGE_ID=%s BATCHQ_RESULT=timeout", BATCH_END)
        assert timed_out, journal(host, "spool")
        claim = next(r for r in records(host) if r["event"] == "claim" and slow + "~1" in r["names"])
        end = [r for r in records(host) if r["event"] == "end" and r["batch"] == claim["batch"]]
        assert [r["outcome"] for r in end] == ["terminated"], (claim["batch"], end, journal(host, "spool"))
        end = end[0]
        # it gave the slow file back with its attempt counted, and left nothing for another batch to take back
        assert slow + "~1" in end["left"] and not takebacks(host, slow), (end, takebacks(host, slow))
        # the others it gave back, which it had not started, got their attempt back
        assert all(done[n.split("~")[0]]["attempt"] == 1 for n in end["left"] if n != slow + "~1"), end
        # ... and the files it had finished (none, when its claim began at the poison) are its results
        assert all(done[n.split("~")[0]]["by"] == claim["batch"] for n in end["done"]), end

        # the crashing file's work died in its own process on each attempt: no batch died with it
        assert not takebacks(host, crash), takebacks(host, crash)
        # each poison file failed each of its attempts, the last one for good
        for name, error in ((fail, "ValueError: file payload asks to fail"),
                            (crash, "its work's process was killed by SIGSEGV before it reported")):
            attempts = host.check_output("journalctl --no-pager -o cat -u 'batchq-spool@*' | grep -F %s",
                                         name + ": attempt")
            # each line names the error's type, so that a reader tells a job's own error from the spool's
            assert attempts.splitlines() == ["%s: attempt %d failed: %s%s" % (
                name, n, error, " (failed for good)" if n == MAX_ATTEMPTS else "")
                for n in range(1, MAX_ATTEMPTS + 1)], attempts


def start_spool_drain(host, prefix):
    """1000 files of 50 ms each, some 25 s of work for the two instances; returns
    (what was enqueued, the spool's counts and the time before), once 50 are done."""
    before = stats(host), time.time()
    enqueued = enqueue(host, "1000 --prefix %s --sleep 0.05" % prefix)
    wait_for(lambda: stats(host)["done"] >= before[0]["done"] + 50, 60, "the spool drain to be under way")
    return enqueued, before


def assert_spool_drained_after_reboot(host, enqueued, before, booted):
    """The drain went on after the boot and did every file once; the reboot
    ended a batch of it (files taken back after the boot, or put back by a
    batch that a shutdown's SIGTERM stopped)."""
    wait_for(lambda: drained(host, before[0]["done"] + len(enqueued), before[0]["failed"]), 120,
             "the spool drain of %s to end after the reboot%s" % (host.backend.get_hostname(), journal(host, "spool")))
    assert_each_done_once(host, enqueued, since=before[1])
    ours = [r for r in records(host) if r["time"] > before[1]]
    after_boot = [r for r in ours if r["time"] > booted]
    assert [r for r in after_boot if r["event"] == "end" and r["done"]], "nothing done after the boot"
    cut = [t for r in after_boot if r["event"] == "claim" for t in r["taken_back"]]
    stopped = [r for r in ours if r["event"] == "end" and r["outcome"] == "terminated" and r["left"]]
    assert cut or stopped, "the reboot ended no batch of the drain%s" % journal(host, "spool")
