"""The spool example's consumer (examples/spool_queue/batchq-spool): its pure
rules, and its batches as processes on a spool in a temporary folder (no systemd)."""

import argparse
import errno
import fcntl
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "spool_queue"
CONSUMER, ENQUEUE = EXAMPLE / "batchq-spool", EXAMPLE / "batchq-spool-enqueue"


def _load(path, name="batchq_spool"):
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


spool = _load(CONSUMER)
enqueuer = _load(ENQUEUE, "batchq_spool_enqueue")


@pytest.mark.parametrize("name, parsed", [
    ("job-1.json", ("job-1.json", 0, 0)),
    ("job-1.json~2", ("job-1.json", 2, 0)),
    ("job-1.json~2~1796146351000", ("job-1.json", 2, 1796146351000)),
    (".result", None), ("lock~x", None), ("a~1~2~3", None), ("~1", None), ("job\n", ("job\n", 0, 0)),
])
def test_a_name_carries_the_attempts_and_the_due_time(name, parsed):
    assert spool.parse(name) == parsed
    if parsed:
        assert spool.spool_name(*parsed) == name


def test_the_backoff_doubles_from_its_least_up_to_its_cap_and_keeps_the_upper_half_of_each_step():
    low = [spool.backoff(n, 10, 100, uniform=lambda a, b: a) for n in range(1, 7)]
    high = [spool.backoff(n, 10, 100, uniform=lambda a, b: b) for n in range(1, 7)]
    assert low == [5, 10, 20, 40, 50, 50]
    assert high == [10, 20, 40, 80, 100, 100]
    assert all(5 <= spool.backoff(1, 10, 100) <= 10 for draw in range(100))


def test_a_claim_takes_due_files_in_name_order_and_none_of_another_name():
    names = ["b", "a~1~2000", "c~2~999", ".b.tmp", "d~x", "a"]
    assert spool.due_names(names, 1000) == ["a", "b", "c~2~999"]


@pytest.mark.parametrize("claimed, failed, left, code", [
    (10, 0, 0, 75),   # a full batch: more may wait
    (7, 2, 0, 0),     # less than a full batch, all of it attempted: drained
    (7, 2, 3, 75),    # files put back undone (SIGTERM, --max-seconds)
    (0, 0, 0, 0),     # nothing due
    (10, 10, 0, 1),   # every file failed: an outage, not a backlog
    (3, 3, 0, 1),
])
def test_the_exit_code_follows_the_contract(claimed, failed, left, code):
    assert spool.exit_code(claimed, failed, left, 10, 75) == code


@pytest.fixture
def top(tmp_path):
    (tmp_path / "state").mkdir()
    return tmp_path / "spool"


def enqueue(top, *arguments):
    subprocess.run([sys.executable, str(ENQUEUE), *arguments, "--spool", str(top)], check=True, stdout=subprocess.DEVNULL)


def batch(top, *arguments, wait=True):
    env = dict(os.environ, STATE_DIRECTORY=str(top.parent / "state"))
    env.pop("INVOCATION_ID", None)
    process = subprocess.Popen([sys.executable, str(CONSUMER), "--spool", str(top), "--backoff-min", "0.01",
                                "--backoff-max", "0.02", *arguments], env=env, stdout=subprocess.DEVNULL)
    return process.wait(timeout=60) if wait else process


def records(top):
    with open(top.parent / "state" / "batches.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def results(top):
    return {name: json.loads((top / "done" / name).read_text()) for name in os.listdir(top / "done")}


def stats(top):
    out = subprocess.run([sys.executable, str(ENQUEUE), "--stats", "--spool", str(top)], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def test_concurrent_batches_never_share_a_file(top):
    enqueue(top, "600")
    batches = [batch(top, "--limit", "1000", wait=False) for instance in range(4)]
    assert sorted(b.wait(timeout=60) for b in batches) == [0, 0, 0, 0]
    done = os.listdir(top / "done")
    assert len(done) == 600 and stats(top)["incoming"] == stats(top)["claims"] == 0
    assert all(json.loads((top / "done" / name).read_text())["attempt"] == 1 for name in done)
    claims = [r["names"] for r in records(top) if r["event"] == "claim"]
    assert len(claims) == 4 and len({name for names in claims for name in names}) == sum(map(len, claims)) == 600
    assert sum(len(r["done"]) for r in records(top) if r["event"] == "end") == 600


def batches_until(top, done, *arguments):
    """Run batch after batch (a file put back is due again 10-20 ms later) until done(); their exit codes."""
    codes = []
    while not done():
        assert len(codes) < 20, codes
        codes.append(batch(top, *arguments))
        time.sleep(0.05)
    return codes


def test_a_killed_batch_counts_the_file_it_was_at_and_gives_the_others_their_attempt_back(top):
    enqueue(top, "1", "--prefix", "a", "--sleep", "30", "--sleep-attempts", "1")
    enqueue(top, "3", "--prefix", "b")
    stuck = batch(top, "--limit", "10", wait=False)
    deadline = time.monotonic() + 30
    # the batch noted the file it is at in its lock file
    while not [lock for lock in (top / "claims").glob("*/lock") if lock.read_text()]:
        assert time.monotonic() < deadline, "the batch started no file"
        time.sleep(0.05)
    stuck.send_signal(signal.SIGKILL)
    stuck.wait(timeout=10)
    batches_until(top, lambda: len(os.listdir(top / "done")) == 4, "--limit", "10")
    results = {name: json.loads((top / "done" / name).read_text()) for name in os.listdir(top / "done")}
    assert {name: r["attempt"] for name, r in results.items()} == {
        "a-000001.json": 2, "b-000001.json": 1, "b-000002.json": 1, "b-000003.json": 1}
    assert stats(top)["claim_folders"] == 0


def test_a_file_that_kills_every_batch_ends_in_failed_after_its_attempts(top):
    enqueue(top, "1", "--prefix", "crash", "--crash")
    codes = batches_until(top, lambda: os.listdir(top / "failed"), "--max-attempts", "3")
    assert codes.count(-signal.SIGSEGV) == 3 and set(codes) <= {-signal.SIGSEGV, 0}, codes
    assert os.listdir(top / "failed") == ["crash-000001.json~3"]
    assert stats(top)["incoming"] == stats(top)["claim_folders"] == 0


def test_failed_attempts_end_in_failed_and_a_batch_of_failures_is_a_failure(top):
    enqueue(top, "2", "--prefix", "bad", "--fail")
    codes = batches_until(top, lambda: len(os.listdir(top / "failed")) == 2, "--max-attempts", "2")
    assert codes.count(1) == 2 and set(codes) <= {0, 1}, codes
    assert sorted(os.listdir(top / "failed")) == ["bad-000001.json~2", "bad-000002.json~2"]


def test_a_stopped_batch_puts_back_what_it_did_not_start_and_says_more_waits(top):
    enqueue(top, "20", "--sleep", "0.2")
    process = batch(top, "--limit", "100", wait=False)
    deadline = time.monotonic() + 30
    while not os.listdir(top / "done"):
        assert time.monotonic() < deadline, "the batch did nothing"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 75
    left = os.listdir(top / "incoming")
    assert left and all("~" not in name for name in left), left  # their attempt given back
    assert len(left) + len(os.listdir(top / "done")) == 20


def test_an_unusable_spool_fails_the_batch(tmp_path):
    assert batch(tmp_path / "nowhere") == 1


def wait_for_note(top, name):
    """Until a running batch notes name in its lock file (it is at that file)."""
    deadline = time.monotonic() + 30
    while name + "\n" not in [lock.read_text() for lock in (top / "claims").glob("*/lock")]:
        assert time.monotonic() < deadline, "the batch did not come to %s" % name
        time.sleep(0.02)


def test_a_killed_batch_keeps_the_files_it_finished_and_none_is_redone(top):
    enqueue(top, "3", "--prefix", "a")
    enqueue(top, "1", "--prefix", "b", "--sleep", "30", "--sleep-attempts", "1")
    enqueue(top, "2", "--prefix", "c")
    stuck = batch(top, "--limit", "10", wait=False)
    wait_for_note(top, "b-000001.json~1")
    # what it finished left its claim at once: only the file at hand and those not started are there
    (claim,) = (top / "claims").iterdir()
    assert sorted(os.listdir(claim)) == ["b-000001.json~1", "c-000001.json~1", "c-000002.json~1", "lock"]
    stuck.send_signal(signal.SIGKILL)
    stuck.wait(timeout=10)
    batches_until(top, lambda: len(os.listdir(top / "done")) == 6, "--limit", "10")
    by = {name: (r["attempt"], r["by"].split("/")[2]) for name, r in results(top).items()}
    killed = "pid%d#1" % stuck.pid
    assert {name: by[name] for name in by if name.startswith("a")} == {
        "a-00000%d.json" % n: (1, killed) for n in (1, 2, 3)}, "a file the killed batch did was done again"
    assert by["b-000001.json"][0] == 2 and by["c-000001.json"][0] == by["c-000002.json"][0] == 1
    (taken,) = [t for r in records(top) if r["event"] == "claim" for t in r["taken_back"]]
    assert (taken["counted"], taken["refunded"]) == (["b-000001.json~1"], ["c-000001.json~1", "c-000002.json~1"])
    assert not [r for r in records(top) if r["event"] == "end" and r["redone"]]


def options(**given):
    return argparse.Namespace(**dict(dict(max_attempts=3, backoff_min=0.01, backoff_max=0.02, limit=10, work_ms=0,
                                          max_seconds=0, records_bytes=1 << 20), **given))


def dead_claim(top, note, *names):
    """A claim folder as a batch that died leaves it: its lock (free) with note, and files."""
    enqueue(top, "0")
    folder = top / "claims" / "dead"
    folder.mkdir()
    (folder / "lock").write_bytes(note)
    for name in names:
        (folder / os.fsdecode(name)).write_bytes(b"{}")
    return folder


def test_a_file_whose_result_is_written_is_never_charged_nor_done_again(top):
    folder = dead_claim(top, b"x~1\n", b"x~1", b"y~1")
    identity = spool.identity(folder / "x~1")
    (top / "done" / "x").write_text(json.dumps({"file": identity, "attempt": 1}))
    (taken,) = spool.Spool(str(top), options()).take_back("")
    assert (taken["finished"], taken["counted"], taken["refunded"]) == (["x~1"], [], ["y~1"])
    assert os.listdir(top / "incoming") == ["y"] and not os.listdir(top / "claims")
    assert json.loads((top / "done" / "x").read_text()) == {"file": identity, "attempt": 1}


def test_the_noted_name_is_matched_whole_whatever_its_bytes(top):
    odd = b" lead\xff~1"  # a leading space, and not UTF-8
    dead_claim(top, odd + b"\n", odd, b"lead~1")
    (taken,) = spool.Spool(str(top), options()).take_back("")
    assert (taken["counted"], taken["refunded"]) == ([os.fsdecode(odd)], ["lead~1"])
    # ... and a batch notes such a name and does its file
    (top / "incoming" / os.fsdecode(b" new\xfe")).write_bytes(b"data")
    assert batch(top, "--max-attempts", "5") == 0
    assert os.fsdecode(b" new\xfe") in os.listdir(top / "done")


def test_without_records_a_batch_works_and_says_so(top, tmp_path):
    enqueue(top, "3")
    done = subprocess.run([sys.executable, str(CONSUMER), "--spool", str(top)], check=False, stderr=subprocess.PIPE,
                          stdout=subprocess.DEVNULL, text=True, env=dict(os.environ, STATE_DIRECTORY=str(tmp_path / "no")))
    assert done.returncode == 0 and "warning: no claim record" in done.stderr, done.stderr
    assert len(os.listdir(top / "done")) == 3 and not os.listdir(top / "claims")


def test_an_error_of_the_batch_itself_gives_its_files_back_uncharged(top, monkeypatch):
    enqueue(top, "3")

    def full(*arguments):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(spool, "write_result", full)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    assert spool.main(["--spool", str(top)]) == 1
    assert sorted(os.listdir(top / "incoming")) == ["job-00000%d.json" % n for n in (1, 2, 3)]
    assert not os.listdir(top / "claims") and not os.listdir(top / "failed")


def test_a_file_goes_to_failed_rather_than_over_another_of_its_name(top):
    dead_claim(top, b"", b"x~1")
    (top / "incoming" / "x").write_text("newer")
    (taken,) = spool.Spool(str(top), options()).take_back("")
    assert taken["failed"] == ["x~1"] and (top / "incoming" / "x").read_text() == "newer"
    (aside,) = os.listdir(top / "failed")
    assert spool.parse(aside)[:2] == ("x", 1)
    # a result is never replaced by another file's
    (top / "done" / "x").write_text('{"file": "another"}')
    assert batch(top) == 1
    assert (top / "done" / "x").read_text() == '{"file": "another"}' and len(os.listdir(top / "failed")) == 2
    # ... and the enqueue tool refuses a name that done/ or incoming/ holds
    (top / "done" / "z-000001.json").write_text("{}")
    with pytest.raises(subprocess.CalledProcessError):
        enqueue(top, "1", "--prefix", "z")
    enqueue(top, "1", "--prefix", "y")
    with pytest.raises(subprocess.CalledProcessError):
        enqueue(top, "1", "--prefix", "y")


def test_stats_do_not_fail_on_a_claim_folder_that_ends_meanwhile(top, monkeypatch):
    enqueue(top, "0")
    (top / "claims" / "ending").mkdir()
    listdir = os.listdir

    def racing(path):
        if str(path).endswith("ending"):
            os.rmdir(path)
        return listdir(path)
    monkeypatch.setattr(enqueuer.os, "listdir", racing)
    assert enqueuer.stats(str(top))["claims"] == 0


def test_claim_folders_are_unique_without_an_invocation(top, monkeypatch):
    enqueue(top, "0")
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    queue = spool.Spool(str(top), options())
    first, second = queue.open_claim(), queue.open_claim()
    assert first[0] != second[0]
    for _folder, lock in (first, second):
        with pytest.raises(BlockingIOError):
            fcntl.flock(os.open(os.path.join(_folder, "lock"), os.O_RDWR), fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(lock)
