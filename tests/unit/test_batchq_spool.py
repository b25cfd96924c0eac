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


def test_an_error_of_the_batch_itself_fails_it_and_charges_only_the_file_at_work(top, monkeypatch):
    enqueue(top, "3")

    def full(*arguments):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(spool, "write_result", full)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    assert spool.main(["--spool", str(top)]) == 1
    incoming = sorted(os.listdir(top / "incoming"))
    assert incoming[0].startswith("job-000001.json~1~") and incoming[1:] == ["job-000002.json", "job-000003.json"]
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


# Hostile inputs: names, results and errors a careless producer or process() gives
def spool_args(**options):
    values = dict(limit=100, work_ms=0.0, max_attempts=3, backoff_min=0.01, backoff_max=0.02, max_seconds=0.0,
                  backlog_exit_code=75, records_bytes=1 << 20)
    values.update(options)
    return argparse.Namespace(**values)


def in_process_batch(top, monkeypatch, work, **options):
    """One batch in this process, with work(path, attempt) as process()."""
    monkeypatch.setenv("STATE_DIRECTORY", str(top.parent / "state"))
    monkeypatch.setattr(spool, "process", lambda path, attempt, work_ms: work(path, attempt))
    args = spool_args(**options)
    return spool.run_batch(spool.Spool(str(top), args), args, 0)


def put(top, name, data=b"{}\n"):
    for folder in spool.FOLDERS:
        (top / folder).mkdir(parents=True, exist_ok=True)
    path = os.path.join(os.fsencode(str(top / "incoming")), os.fsencode(name))
    with open(path, "wb") as handle:
        handle.write(data)


def test_a_name_too_long_to_carry_its_attempts_goes_to_failed_unchanged_and_stalls_nothing(top, monkeypatch, capfd):
    longest = os.pathconf(str(top.parent), "PC_NAME_MAX") - spool.SUFFIX_BYTES
    put(top, "a" * (longest + 1))
    put(top, "b" * longest)  # the longest name that carries its attempts
    put(top, "c.json")
    did = in_process_batch(top, monkeypatch, lambda path, attempt: {"ok": True})
    assert did["too_long"] == ["a" * (longest + 1)] and "error" not in did, did
    assert sorted(did["done"]) == ["b" * longest + "~1", "c.json~1"]
    assert os.listdir(top / "failed") == ["a" * (longest + 1)]
    assert "the name is too long to carry its attempts (at most %d bytes)" % longest in capfd.readouterr().err


def test_the_longest_name_fails_all_its_attempts_and_its_backoff_names_fit(top, monkeypatch):
    longest = os.pathconf(str(top.parent), "PC_NAME_MAX") - spool.SUFFIX_BYTES
    name = "\u00e9" * (longest // 2)  # two bytes each in UTF-8
    put(top, name)

    def fail(path, attempt):
        raise ValueError("no")
    for attempt in range(1, 4):
        did = in_process_batch(top, monkeypatch, fail, backoff_min=0.001, backoff_max=0.001, max_attempts=3)
        assert "error" not in did and len(did["failed"] + did["dead"]) == 1, did
        time.sleep(0.01)
    assert os.listdir(top / "failed") == [name + "~3"]


def test_names_the_spool_does_not_own_are_said_and_left_alone(top, monkeypatch, capfd):
    for name in ("report~final.json", ".partial", "good.json"):
        put(top, name)
    did = in_process_batch(top, monkeypatch, lambda path, attempt: {})
    assert did["done"] == ["good.json~1"] and did["strangers"] == [".partial", "report~final.json"]
    assert "2 files in incoming/ are never claimed" in capfd.readouterr().err
    assert sorted(os.listdir(top / "incoming")) == [".partial", "report~final.json"]


ODD_ERRORS = [ValueError("nul \x00 byte"), ValueError("lone \udcff surrogate"), RuntimeError("x" * (1 << 20)),
              KeyError(b"\xff"), type("Unprintable", (Exception,), {"__str__": lambda self: 1 / 0})()]


@pytest.mark.parametrize("error", ODD_ERRORS, ids=["nul", "surrogate", "1MB", "bytes", "unprintable"])
def test_any_error_text_is_the_files_failed_attempt_and_its_neighbours_are_done(top, monkeypatch, error):
    for name in ("a.json", "b.json", "c.json"):
        put(top, name)

    def work(path, attempt):
        if path.endswith("b.json~1"):
            raise error
        return {"ok": True}
    did = in_process_batch(top, monkeypatch, work)
    assert "error" not in did and sorted(did["done"]) == ["a.json~1", "c.json~1"], did
    assert [f["name"] for f in did["failed"]] == ["b.json~1"]
    assert len(did["failed"][0]["error"]) <= spool.ERROR_CHARS + 40
    json.dumps(did)  # the records can hold it


@pytest.mark.parametrize("value", [{1, 2}, float("nan"), object(), {"bytes": b"\x00"}],
                         ids=["set", "nan", "object", "bytes"])
def test_a_result_json_cannot_hold_is_the_files_failed_attempt(top, monkeypatch, value):
    put(top, "a.json")
    put(top, "b.json")
    did = in_process_batch(top, monkeypatch, lambda path, attempt: value if path.endswith("a.json~1") else "plain")
    assert "error" not in did and [f["name"] for f in did["failed"]] == ["a.json~1"], did
    assert did["done"] == ["b.json~1"] and results(top)["b.json"]["result"] == "plain"


def test_a_batch_that_fails_itself_charges_the_file_at_work_and_gives_the_others_back(top, monkeypatch):
    for name in ("a.json", "b.json", "c.json"):
        put(top, name)
    real = spool.write_result

    def full_disk(folder, done, base, file_id, text):
        if base == "b.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(folder, done, base, file_id, text)
    monkeypatch.setattr(spool, "write_result", full_disk)
    did = in_process_batch(top, monkeypatch, lambda path, attempt: {})
    assert "No space left on device" in did["error"]
    assert did["done"] == ["a.json~1"] and [f["name"] for f in did["failed"]] == ["b.json~1"], did
    assert did["left"] == ["c.json~1"]
    incoming = sorted(os.listdir(top / "incoming"))
    assert incoming[0].startswith("b.json~1~") and incoming[1:] == ["c.json"], incoming


def test_a_file_that_fails_every_batch_itself_ends_in_failed(top, monkeypatch):
    put(top, "b.json")

    def full_disk(folder, done, base, file_id, text):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(spool, "write_result", full_disk)
    for attempt in range(3):
        did = in_process_batch(top, monkeypatch, lambda path, attempt: {}, backoff_min=0.001, backoff_max=0.001)
        assert "error" in did
        time.sleep(0.01)
    assert os.listdir(top / "failed") == ["b.json~3"]


def test_the_backoff_of_many_attempts_stays_at_its_cap():
    assert 1800 <= spool.backoff(100000, 10, 3600) <= 3600


@pytest.mark.parametrize("options, named", [
    (["--limit", "-5"], "--limit"), (["--limit", "0"], "--limit"),
    (["--max-attempts", "0"], "--max-attempts"), (["--max-attempts", "1100"], "--max-attempts"),
    (["--work-ms", "-1"], "--work-ms"), (["--work-ms", "nan"], "--work-ms"),
    (["--backoff-min", "0"], "--backoff-min"), (["--backoff-min", "5", "--backoff-max", "1"], "--backoff-max"),
    (["--max-seconds", "-1"], "--max-seconds"), (["--backlog-exit-code", "1"], "--backlog-exit-code"),
    (["--records-bytes", "10"], "--records-bytes"),
])
def test_a_bad_option_exits_2_naming_it_before_anything_is_claimed(top, options, named):
    enqueue(top, "3")
    env = dict(os.environ, STATE_DIRECTORY=str(top.parent / "state"))
    process = subprocess.run([sys.executable, str(CONSUMER), "--spool", str(top), *options], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
    assert process.returncode == 2 and "error: %s: must be" % named in process.stderr, process.stderr
    assert len(os.listdir(top / "incoming")) == 3 and os.listdir(top / "claims") == []
