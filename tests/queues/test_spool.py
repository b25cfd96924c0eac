"""The spool consumer (examples/spool_queue/batchq-spool, on the queue library)
as a process on a spool in a temporary folder: results once, poison files,
odd names, works that crash, hang or lie, options, exit codes, and the
take-back of a killed batch's claims."""

import contextlib
import hashlib
import json
import os
import resource
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

import batchq_spool
from conftest import TOP, alive, guide_consumer
from waiting import wait_for

EXAMPLE = os.path.join(TOP, "examples", "spool_queue")
CONSUMER, ENQUEUE = os.path.join(EXAMPLE, "batchq-spool"), os.path.join(EXAMPLE, "batchq-spool-enqueue")
# A consumer of one's own, as the writing guide shows: the library, the spool backend, a work of its own.
# Its payloads ask for the faults the stand-in does not know.
OWN_CONSUMER = """
import json, sys, time
sys.path[:0] = [%r, %r]
import batchq_queue, batchq_spool

def process(job):
    with open(job.payload) as handle:
        asked = json.load(handle)
    if "exit" in asked:
        sys.exit(asked["exit"])
    if asked.get("hang"):
        time.sleep(60)
    if asked.get("nan"):
        return float("nan")
    return {"asked": asked}

sys.exit(batchq_queue.main(sys.argv[1:], process, batchq_spool.add_options, batchq_spool.backend,
                           batchq_spool.check))
""" % (EXAMPLE, os.path.join(TOP, "examples", "queue_library"))


@pytest.fixture
def top(tmp_path):
    (tmp_path / "state").mkdir()
    subprocess.run([sys.executable, ENQUEUE, "0", "--spool", str(tmp_path / "spool")], check=True,
                   stdout=subprocess.DEVNULL)
    return tmp_path / "spool"


def enqueue(top, *arguments):
    subprocess.run([sys.executable, ENQUEUE, *arguments, "--spool", str(top)], check=True, stdout=subprocess.DEVNULL)


def put(top, name, data=b"{}\n"):
    with open(os.path.join(os.fsencode(str(top / "incoming")), os.fsencode(name)), "wb") as handle:
        handle.write(data)


# A batch may use this much address space: one that reads a hostile file without bound fails, not the machine.
MEMORY_BYTES = 1 << 30


def bounded_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def start(top, *arguments, program=CONSUMER):
    env = dict(os.environ, STATE_DIRECTORY=str(top.parent / "state"))
    env.pop("INVOCATION_ID", None)
    return subprocess.Popen([sys.executable, program, "--spool", str(top), "--backoff-min", "0.01",
                             "--backoff-max", "0.02", *arguments], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
                            preexec_fn=bounded_memory)


def batch(top, *arguments, program=CONSUMER, timeout=60):
    """One batch to its end: (exit code, stderr). A batch that outlasts timeout is killed, and the test fails."""
    process = start(top, *arguments, program=program)
    try:
        _out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # and the work's process dies with its batch
        _out, err = process.communicate()
        raise AssertionError("the batch hung for %gs: %s" % (timeout, err)) from None
    return process.returncode, err


def batches_until(top, done, *arguments, program=CONSUMER):
    """Batch after batch (a failed file is due again 10-20 ms later) until done(); their exit codes."""
    codes = []
    while not done():
        assert len(codes) < 20, codes
        codes.append(batch(top, *arguments, program=program)[0])
        wait_for(lambda: not [n for n in os.listdir(top / "incoming") if batchq_spool.parse(n)[2] > time.time() * 1000],
                 5, "the files put back to be due")
    return codes


def records(top):
    with open(top.parent / "state" / "batches.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def results(top):
    """The results of done/: its regular files (a FIFO or a link planted there is never opened)."""
    return {name: json.loads((top / "done" / name).read_text()) for name in os.listdir(top / "done")
            if stat.S_ISREG(os.lstat(top / "done" / name).st_mode)}


def listing(top):
    return {folder: sorted(os.listdir(top / folder)) for folder in batchq_spool.FOLDERS}


def test_concurrent_batches_do_each_file_once(top):
    enqueue(top, "600")
    batches = [start(top, "--limit", "1000") for _instance in range(4)]
    assert [b.wait(timeout=60) for b in batches] == [0, 0, 0, 0]
    done = results(top)
    assert sorted(done) == ["job-%06d.json" % n for n in range(1, 601)]
    assert {r["attempt"] for r in done.values()} == {1}
    claims = [r["names"] for r in records(top) if r["event"] == "claim"]
    assert len({name for names in claims for name in names}) == sum(map(len, claims)) == 600
    # each result names the batch whose end record lists it as done
    by = {name.split("~")[0]: r["batch"] for r in records(top) if r["event"] == "end" for name in r["done"]}
    assert {name: r["by"] for name, r in done.items()} == by
    # ... and holds the digest of what was enqueued
    assert done["job-000007.json"]["sha256"] == __import__("hashlib").sha256(b'{"n": 7}\n').hexdigest()
    assert listing(top)["claims"] == listing(top)["incoming"] == []


@pytest.mark.parametrize("fault, error", [
    ("--fail", "ValueError: file payload asks to fail"),
    ("--crash", "its work's process was killed by SIGSEGV before it reported"),
])
def test_a_poison_file_goes_to_failed_after_exactly_its_attempts_and_spares_its_neighbours(top, fault, error):
    enqueue(top, "1", "--prefix", "bad", fault)
    enqueue(top, "2", "--prefix", "good")
    codes = batches_until(top, lambda: os.listdir(top / "failed"), "--max-attempts", "3")
    assert len(codes) == 3 and codes[1:] == [1, 1], codes  # a batch of failures alone is an outage
    assert listing(top)["failed"] == ["bad-000001.json~3"]
    assert sorted(results(top)) == ["good-000001.json", "good-000002.json"]
    attempts = [e for r in records(top) if r["event"] == "end" for e in r["errors"]]
    assert attempts == [{"name": "bad-000001.json~%d" % n, "error": error} for n in (1, 2, 3)]


def test_the_journal_says_each_failed_attempt_of_a_file(top):
    enqueue(top, "1", "--prefix", "bad", "--fail")
    lines = []
    while not os.listdir(top / "failed"):
        assert len(lines) < 20
        _code, err = batch(top, "--max-attempts", "2")
        lines += [line for line in err.splitlines() if line.startswith("bad-000001.json: ")]
        time.sleep(0.03)
    assert lines == ["bad-000001.json: attempt 1 failed: ValueError: file payload asks to fail",
                     "bad-000001.json: attempt 2 failed: ValueError: file payload asks to fail (failed for good)"]


@pytest.mark.parametrize("asked, error", [
    ({"exit": 0}, "SystemExit: 0"),
    ({"exit": 3}, "SystemExit: 3"),
    ({"hang": True}, "its work outlasted --job-timeout (1s)"),
    ({"nan": True}, "ValueError: Out of range float values are not JSON compliant"),
])
def test_a_work_that_exits_hangs_or_returns_no_json_fails_its_file_alone(top, tmp_path, asked, error):
    program = tmp_path / "consumer.py"
    program.write_text(OWN_CONSUMER)
    put(top, "a.json", json.dumps(asked).encode())
    put(top, "b.json", b'{"n": 2}')
    code, err = batch(top, "--job-timeout", "1", "--max-attempts", "1", program=str(program))
    assert code == 0, err
    assert listing(top)["failed"] == ["a.json~1"] and results(top)["b.json"]["asked"] == {"n": 2}
    (end,) = [r for r in records(top) if r["event"] == "end"]
    assert end["errors"] == [{"name": "a.json~1", "error": error}] and end["done"] == ["b.json~1"]


def test_a_name_too_long_to_carry_its_attempts_goes_to_failed_unchanged(top, capfd):
    name_max = os.pathconf(str(top), "PC_NAME_MAX")
    longest = name_max - batchq_spool.SUFFIX_BYTES
    put(top, "a" * name_max)  # 255 bytes on most file systems
    put(top, "\u00e9" * (longest // 2))  # the longest that carries its attempts, in two-byte characters
    put(top, "c.json")
    code, err = batch(top)
    assert code == 0, err
    assert listing(top)["failed"] == ["a" * name_max]
    assert sorted(results(top)) == sorted(["\u00e9" * (longest // 2), "c.json"])
    assert "the name is too long to carry its attempts (at most %d bytes)" % longest in err


def test_the_longest_name_fails_all_its_attempts_and_its_backoff_names_fit(top):
    name = "\u00e9" * ((os.pathconf(str(top), "PC_NAME_MAX") - batchq_spool.SUFFIX_BYTES) // 2)
    put(top, name, b'{"fail": true}')
    batches_until(top, lambda: os.listdir(top / "failed"), "--max-attempts", "3")
    assert listing(top)["failed"] == [name + "~3"]


def test_names_the_spool_does_not_own_are_said_and_left_alone(top):
    for name in ("report~final.json", ".partial", "x~1~2~3", "good.json"):
        put(top, name)
    code, err = batch(top)
    assert code == 0 and "3 files in incoming/ are never claimed" in err, err
    assert listing(top)["incoming"] == [".partial", "report~final.json", "x~1~2~3"]
    assert sorted(results(top)) == ["good.json"]
    (claim,) = [r for r in records(top) if r["event"] == "claim"]
    assert claim["strangers"] == [".partial", "report~final.json", "x~1~2~3"]


@pytest.mark.parametrize("arguments, named", [
    (["--limit", "0"], "--limit"), (["--max-attempts", "1001"], "--max-attempts"),
    (["--work-ms", "nan"], "--work-ms"), (["--backoff-min", "-1"], "--backoff-min"),
    (["--backoff-min", "5", "--backoff-max", "1"], "--backoff-max"), (["--max-seconds", "-1"], "--max-seconds"),
    (["--backlog-exit-code", "1"], "--backlog-exit-code"), (["--job-timeout", "0"], "--job-timeout"),
    (["--records-bytes", "10"], "--records-bytes"), (["--spool", "/nonexistent"], "--spool"),
    (["--keep-done-days", "-1"], "--keep-done-days"), (["--keep-done-days", "nan"], "--keep-done-days"),
])
def test_a_bad_option_exits_2_naming_it_before_anything_is_claimed(top, arguments, named):
    enqueue(top, "3")
    code, err = batch(top, *arguments)
    assert code == 2 and "error: %s: must be" % named in err, err
    assert len(listing(top)["incoming"]) == 3 and listing(top)["claims"] == []


def test_it_exits_75_only_when_it_did_a_file_and_more_waits(top, tmp_path):
    enqueue(top, "3")
    assert batch(top, "--limit", "2")[0] == 75
    assert batch(top, "--limit", "2")[0] == 0
    assert batch(top, "--limit", "2")[0] == 0  # nothing due
    # a full batch of failures is an outage, not a backlog, however much waits
    enqueue(top, "3", "--prefix", "down")
    (tmp_path / "down").touch()
    assert batch(top, "--limit", "2", "--fail-while", str(tmp_path / "down"))[0] == 1
    assert not results(top).keys() & {"down-000001.json", "down-000002.json"}


def test_a_stopped_batch_gives_back_the_attempts_of_files_it_did_not_start(top):
    enqueue(top, "20", "--sleep", "0.2")
    process = start(top, "--limit", "100")
    wait_for(lambda: os.listdir(top / "done"), 30, "a file done")
    process.send_signal(signal.SIGTERM)  # the library forwards it to the work at hand
    _out, err = process.communicate(timeout=30)
    assert process.returncode == 75, err
    left = listing(top)["incoming"]
    # the file whose work the stop ended keeps its attempt, due at once; the others get theirs back
    assert len(left) > 1 and [name for name in left if "~" in name] in ([], [left[0].split("~")[0] + "~1"]), left
    left = sorted(name.split("~")[0] for name in left)
    assert len(left) + len(listing(top)["done"]) == 20 and listing(top)["claims"] == []
    (end,) = [r for r in records(top) if r["event"] == "end"]
    assert end["outcome"] == "terminated" and sorted(n.split("~")[0] for n in end["left"]) == left


def children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as handle:
        return [int(word) for word in handle.read().split()]


def test_a_killed_batchs_claim_is_taken_back_the_file_at_work_counted(top):
    enqueue(top, "2", "--prefix", "a")
    enqueue(top, "1", "--prefix", "b", "--sleep", "30", "--sleep-attempts", "1")
    enqueue(top, "2", "--prefix", "c")
    stuck = start(top, "--limit", "10")
    claims = top / "claims"
    # the note is the name's bytes in hex
    wait_for(lambda: [lock for lock in claims.glob("*/lock") if lock.read_text() == b"b-000001.json~1".hex() + "\n"],
             30, "the batch to note b-000001.json")
    # what it finished left its claim at once: only the file at work and those not started are there
    (claim,) = claims.iterdir()
    assert sorted(os.listdir(claim)) == ["b-000001.json~1", "c-000001.json~1", "c-000002.json~1", "lock"]
    # the note is written just before the work's process starts
    wait_for(lambda: children(stuck.pid), 30, "the work's process of b-000001.json to start")
    (work,) = children(stuck.pid)
    os.killpg(stuck.pid, signal.SIGKILL)  # as a batch's timeout does: the work's process has a group of its own
    stuck.wait(timeout=10)
    try:
        # It dies with its batch: it would hold the claim's lock, and run on beside the next batch.
        wait_for(lambda: not alive(work), 10, "the work's process to die with its batch")
        code, err = batch(top, "--limit", "10", "--backoff-min", "60", "--backoff-max", "60")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(work, signal.SIGKILL)
        stuck.communicate(timeout=10)
    assert code == 0, err
    (taken,) = [t for r in records(top) if r["event"] == "claim" for t in r["taken_back"]]
    assert (taken["working"], taken["counted"], taken["refunded"]) == (
        "b-000001.json~1", ["b-000001.json~1"], ["c-000001.json~1", "c-000002.json~1"])
    killed = "pid%d#1" % stuck.pid
    done = {name: (r["attempt"], r["by"].split("/")[2] == killed) for name, r in results(top).items()}
    assert done == {"a-000001.json": (1, True), "a-000002.json": (1, True),
                    "c-000001.json": (1, False), "c-000002.json": (1, False)}
    # the file at work waits its backoff, its attempt counted
    (back,) = listing(top)["incoming"]
    base, attempts, due = batchq_spool.parse(back)
    assert (base, attempts) == ("b-000001.json", 1) and due > (time.time() + 20) * 1000
    assert not [r for r in records(top) if r["event"] == "end" and r["redone"]]


def dead_claim(top, note, *names):
    """A claim folder as a batch that died leaves it: its lock (free) with note, and files."""
    folder = top / "claims" / "dead"
    folder.mkdir()
    (folder / "lock").write_bytes(note)
    for name in names:
        (folder / os.fsdecode(name)).write_bytes(b"{}")
    return folder


def test_a_file_whose_result_is_written_is_never_charged_nor_done_again(top):
    folder = dead_claim(top, b"x~1\n", b"x~1", b"y~1")
    identity = batchq_spool.identity(os.lstat(folder / "x~1"))
    (top / "done" / "x").write_text(json.dumps({"file": identity, "attempt": 1}))
    assert batch(top)[0] == 0
    (taken,) = [t for r in records(top) if r["event"] == "claim" for t in r["taken_back"]]
    assert (taken["finished"], taken["counted"], taken["refunded"]) == (["x~1"], [], ["y~1"])
    assert json.loads((top / "done" / "x").read_text()) == {"file": identity, "attempt": 1}
    assert results(top)["y"]["attempt"] == 1


def test_the_noted_name_is_matched_whole_whatever_its_bytes(top):
    odd = b" lead\xff~1"  # a leading space, and not UTF-8
    dead_claim(top, odd + b"\n", odd, b"lead~1")
    assert batch(top, "--backoff-min", "60", "--backoff-max", "60")[0] == 0
    (taken,) = [t for r in records(top) if r["event"] == "claim" for t in r["taken_back"]]
    assert (taken["counted"], taken["refunded"]) == ([os.fsdecode(odd)], ["lead~1"])
    assert sorted(results(top)) == ["lead"]


def test_a_file_goes_to_failed_rather_than_over_another_of_its_name(top):
    dead_claim(top, b"", b"x~1")
    put(top, "x", b"newer")
    (top / "done" / "x").write_text('{"file": "another"}')
    code, err = batch(top, "--max-attempts", "1")
    # the claimed one clashed with the newer x in incoming/; the newer one's result was refused, at its last attempt
    assert code == 1 and "names must be unique" in err and "the queue failed" not in err, err
    assert (top / "done" / "x").read_text() == '{"file": "another"}'
    assert sorted(batchq_spool.parse(n)[:2] for n in listing(top)["failed"]) == [("x", 1), ("x", 1)]
    assert listing(top)["incoming"] == listing(top)["claims"] == []


def test_the_guides_consumer_runs_as_written(top, tmp_path):
    """The 15-line consumer of the writing guide's spool section, with the two modules copied where it looks."""
    code = guide_consumer("A directory of files: ``examples/spool_queue``")
    assert 12 <= len(code.splitlines()) <= 16, code
    library = tmp_path / "lib"
    library.mkdir()
    shutil.copy(os.path.join(TOP, "examples", "queue_library", "batchq_queue.py"), library)
    shutil.copy(os.path.join(EXAMPLE, "batchq_spool.py"), library)
    # where examples/spool_queue/spool.yml installs them
    assert '"/usr/local/lib/batchq-queue"' in code
    consumer = tmp_path / "consumer"
    consumer.write_text(code.replace('"/usr/local/lib/batchq-queue"', repr(str(library))))
    put(top, "a.json", b"one")
    put(top, "b.json", b"two")
    code, err = batch(top, program=str(consumer))
    assert code == 0, err
    # a result that is a JSON object is stored with what says which file and attempt it is
    assert {name: result["sha256"] for name, result in results(top).items()} == {
        "a.json": hashlib.sha256(b"one").hexdigest(), "b.json": hashlib.sha256(b"two").hexdigest()}


# Hostile files: what a member of the spool's group can plant (issue 39)

def snapshot(folder):
    """Everything a tree holds, never following a link: {path: (kind, mode, size, mtime, content or target)}."""
    seen = {}
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    content = handle.read()
            else:
                content = None
            seen[os.path.relpath(path, folder)] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode),
                                                   info.st_size, info.st_mtime_ns, content)
    return seen


@pytest.fixture
def outside(tmp_path):
    """A folder beside the spool, not in it, with a file a link may point to."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret").write_bytes(b'{"n": "secret"}\n')
    return folder


def plant(kind, path, target):
    if kind == "link":
        os.symlink(target, path)
    elif kind == "dangling link":
        os.symlink("/nonexistent", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        os.mkdir(path)
        (path / "inner").write_bytes(b"{}")
    else:
        raise AssertionError(kind)


def kind_of(path):
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "dangling link" if os.readlink(path) == "/nonexistent" else "link"
    return {stat.S_IFIFO: "fifo", stat.S_IFDIR: "folder", stat.S_IFREG: "file"}[stat.S_IFMT(info.st_mode)]


def test_a_dangling_link_in_incoming_goes_to_failed_and_the_files_beside_it_are_done(top):
    """Issue 39, item 1: it stalled the whole spool for ever."""
    os.symlink("/nonexistent", top / "incoming" / "aaa")
    put(top, "b.json")
    put(top, "c.json")
    code, err = batch(top)
    assert code == 0, err
    assert sorted(results(top)) == ["b.json", "c.json"]
    assert listing(top)["failed"] == ["aaa"] and os.readlink(top / "failed" / "aaa") == "/nonexistent"
    assert [line for line in err.splitlines() if line.startswith("aaa: ") and "moved to failed/" in line], err


@pytest.mark.parametrize("kind", ["link", "dangling link", "fifo", "folder"])
def test_anything_but_a_regular_file_in_incoming_goes_to_failed_unread(top, outside, kind):
    """Issue 39, item 4: a link in incoming/ was followed, and its target's digest landed in done/."""
    before = snapshot(outside)
    plant(kind, top / "incoming" / "x.json", outside / "secret")
    put(top, "y.json")
    code, err = batch(top, "--max-attempts", "1", "--job-timeout", "5")
    assert code == 0, err
    assert sorted(results(top)) == ["y.json"]
    assert listing(top)["failed"] == ["x.json"] and kind_of(top / "failed" / "x.json") == kind
    assert listing(top)["incoming"] == listing(top)["claims"] == []
    assert snapshot(outside) == before


def test_a_link_planted_in_claims_is_never_followed(top, outside):
    """Issue 39, item 4: a link in claims/ to a folder shaped like a dead claim made a batch move a
    file out of that folder and unlink others."""
    (outside / "lock").write_bytes(b"")  # free, as a dead batch's lock is
    for name in ("x~1", "y~1", "z~2~5", ".result"):
        (outside / name).write_bytes(b"{}")
    before = snapshot(outside)
    os.symlink(outside, top / "claims" / "planted")
    put(top, "a.json")
    code, err = batch(top)
    assert code == 0, err
    assert snapshot(outside) == before
    assert sorted(results(top)) == ["a.json"] and listing(top)["incoming"] == []
    assert listing(top)["claims"] == [] and listing(top)["failed"] == ["planted"]
    assert os.readlink(top / "failed" / "planted") == str(outside)
    assert "planted: not a claim folder (a link) in claims/; moved to failed/, never opened" in err, err


def test_a_claim_folder_whose_lock_is_a_link_is_left_alone(top, outside):
    """Not a batch's claim: its lock is never opened through the link, its files stay, and stderr says so."""
    folder = dead_claim(top, b"", b"x~1")
    os.unlink(folder / "lock")
    os.symlink(outside / "secret", folder / "lock")
    before = snapshot(outside)
    put(top, "a.json")
    code, err = batch(top)
    assert code == 0, err
    assert snapshot(outside) == before and sorted(os.listdir(folder)) == ["lock", "x~1"]
    assert sorted(results(top)) == ["a.json"] and "claims/dead: not taken back: " in err, err


@pytest.mark.parametrize("occupant", ["fifo", "link to /dev/zero", "link to a forged result", "folder"])
def test_what_holds_a_files_name_in_done_is_never_opened_and_fails_that_file_alone(top, outside, occupant):
    """Issue 39, item 2: a FIFO at done/NAME hung the batch itself, outside --job-timeout, and a link
    to /dev/zero ate memory. The file's result is refused (its name is taken): that file fails, alone."""
    put(top, "a.json")
    put(top, "b.json")
    target = top / "done" / "a.json"
    if occupant == "fifo":
        os.mkfifo(target)
    elif occupant == "link to /dev/zero":
        os.symlink("/dev/zero", target)
    elif occupant == "link to a forged result":
        # a result that names a.json itself (its inode and mtime), which the spool would trust as done
        info = os.lstat(top / "incoming" / "a.json")
        (outside / "secret").write_text(json.dumps({"file": "%d:%d" % (info.st_ino, info.st_mtime_ns)}))
        os.symlink(outside / "secret", target)
    else:
        os.mkdir(target)
    before = snapshot(outside)
    code, err = batch(top, "--max-attempts", "1", timeout=30)
    assert code == 0 and "the queue failed" not in err, err
    assert sorted(results(top)) == ["b.json"] and listing(top)["failed"] == ["a.json~1"]
    assert "a.json: attempt 1 failed: its result was refused" in err
    assert listing(top)["done"] == ["a.json", "b.json"] and listing(top)["claims"] == []
    assert snapshot(outside) == before


def test_a_name_taken_in_done_fails_that_file_alone_with_its_backoff(top):
    """Issue 39, item 8: a name clash in done/ failed the whole batch (exit 1, no backoff), and the
    file went dead later as "attempts ran out in batches that died"."""
    (top / "done" / "x").write_text('{"file": "another"}')
    put(top, "x")
    put(top, "y")
    # a backoff of 1 to 2 s: x is not due again before the batch ends, so nothing more waits (exit 0)
    code, err = batch(top, "--max-attempts", "2", "--backoff-min", "2", "--backoff-max", "2")
    assert code == 0 and "the queue failed" not in err, err
    assert "x: attempt 1 failed: its result was refused: " in err and sorted(results(top)) == ["x", "y"]
    (back,) = listing(top)["incoming"]
    assert batchq_spool.parse(back)[:2] == ("x", 1)
    wait_for(lambda: batchq_spool.parse(back)[2] <= time.time() * 1000, 10, "x to be due")
    code, err = batch(top, "--max-attempts", "2")
    assert code == 1 and "the queue failed" not in err, err  # it did none of what it claimed: an outage
    assert "x: attempt 2 failed: its result was refused: " in err and "(failed for good)" in err
    assert listing(top)["failed"] == ["x~2"] and listing(top)["incoming"] == []
    assert (top / "done" / "x").read_text() == '{"file": "another"}'


def test_a_file_whose_name_holds_a_newline_is_charged_when_its_batch_is_killed(top):
    """Issue 39, item 3: the note of the file at work was cut at its first newline, so a take-back
    never charged it, and a file that kills its batch was retried for ever."""
    name = "a\nb.json"
    put(top, name, b'{"sleep": 30, "sleep_attempts": 1}')
    stuck = start(top)
    try:
        # the note is written before the work's process starts
        wait_for(lambda: children(stuck.pid) and [lock for lock in (top / "claims").glob("*/lock") if lock.stat().st_size],
                 30, "the work's process to start")
    finally:
        os.killpg(stuck.pid, signal.SIGKILL)
        stuck.communicate(timeout=30)
    code, err = batch(top, "--backoff-min", "60", "--backoff-max", "60", "--job-timeout", "2")
    assert code == 0, err
    (taken,) = [t for r in records(top) if r["event"] == "claim" for t in r["taken_back"]]
    assert (taken["working"], taken["counted"], taken["refunded"]) == (name + "~1", [name + "~1"], [])
    (back,) = listing(top)["incoming"]
    base, attempts, due = batchq_spool.parse(back)
    assert (base, attempts) == (name, 1) and due > (time.time() + 20) * 1000


def test_results_older_than_keep_done_days_are_pruned_by_a_batch(top, outside):
    """Issue 39, item 15: done/ grew without bound."""
    old = time.time() - 31 * 86400
    for name in ("old-1", "old-2", "fresh"):
        (top / "done" / name).write_text('{"file": "1:1"}')
    os.symlink(outside / "secret", top / "done" / "old-link")
    for name in ("old-1", "old-2", "old-link"):
        os.utime(top / "done" / name, (old, old), follow_symlinks=False)
    before = snapshot(outside)
    put(top, "a.json")
    code, err = batch(top, "--keep-done-days", "30")
    assert code == 0, err
    # only regular files go: a link there is left for a person, and never followed
    assert listing(top)["done"] == ["a.json", "fresh", "old-link"]
    assert snapshot(outside) == before
    (end,) = [r for r in records(top) if r["event"] == "end"]
    assert end["pruned"] == 2
    # a batch scans done/ at most once an hour: the next one leaves an old result for later
    (top / "done" / "old-3").write_text("{}")
    os.utime(top / "done" / "old-3", (old, old))
    assert batch(top, "--keep-done-days", "30")[0] == 0
    assert "old-3" in listing(top)["done"]


def test_a_batch_prunes_a_bounded_number_of_results_and_the_next_goes_on(top):
    old = time.time() - 3 * 86400
    for n in range(5):
        (top / "done" / ("r%d" % n)).write_text("{}")
        os.utime(top / "done" / ("r%d" % n), (old, old))
    (top / "done" / "young").write_text("{}")
    done = os.open(top / "done", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert batchq_spool.prune_done(done, time.time() - 86400, 3) == (3, False)
        assert len(os.listdir(top / "done")) == 3
        assert batchq_spool.prune_done(done, time.time() - 86400, 3) == (2, True)
    finally:
        os.close(done)
    assert listing(top)["done"] == ["young"]


def test_the_documented_way_to_prune_done_by_hand_works(top, outside):
    """The module's docstring says how to prune done/ by hand; run it as written there."""
    (command,) = [line.strip() for line in batchq_spool.__doc__.splitlines() if line.strip().startswith("find ")]
    old = time.time() - 40 * 86400
    (top / "done" / "old").write_text("{}")
    os.symlink(outside / "secret", top / "done" / "old-link")
    (top / "done" / "fresh").write_text("{}")
    for name in ("old", "old-link"):
        os.utime(top / "done" / name, (old, old), follow_symlinks=False)
    before = snapshot(outside)
    subprocess.run(command.replace("SPOOL", shlex.quote(str(top))), shell=True, check=True)
    assert listing(top)["done"] == ["fresh", "old-link"] and snapshot(outside) == before
