"""A property test of the spool consumer against hostile files (issue 39).

Hypothesis draws what incoming/ holds: regular files, links to a file
outside the spool, dangling links, FIFOs and folders, under names of any
bytes (a newline, a CR, a leading space, bytes that are not UTF-8), and
names the spool does not own ("~" inside, a leading "."). It draws what
done/ holds under some files' names (a link outside, a FIFO), a link planted
in claims/ to an outside folder shaped like a dead batch's claim, and the
file at whose work the first batch is SIGKILLed. Batches of batchq-spool
then run, each as a process with a deadline, until the spool is drained.

Every regular file the spool owns ends in done/ with its own digest, done by
one batch, or in failed/ after exactly --max-attempts attempts; whatever else
it owns is in failed/ unchanged; names it does not own stay in incoming/;
nothing outside the spool changes; no batch hangs."""

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import batchq_spool
from test_spool import children, records, snapshot, start
from waiting import wait_for

# Pieces of a name: the bytes a name may hold that need care, and plain ones.
PIECES = [b"a", b"Z", b"0", b"-", b"_", b" ", b"\n", b"\r", b"\t", b"\x01", b"\x7f", b".", b"\xff",
          b"\xc3\xa9", b"\xc3", b"\xe2\x80\xae"]
KINDS = ["link", "dangling link", "fifo", "folder"]
# A batch that outlasts this is hung: the test fails.
BATCH_S = 60

base = st.lists(st.sampled_from(PIECES), min_size=1, max_size=8).map(b"".join).filter(
    lambda name: not name.startswith(b"."))
regular = st.fixed_dictionaries({
    "kind": st.just("file"),
    "fails": st.booleans(),
    "in_done": st.sampled_from([None, "link", "fifo"]),  # what holds its name in done/
})
other = st.fixed_dictionaries({"kind": st.sampled_from(KINDS)})
plan = st.fixed_dictionaries({
    "owned": st.dictionaries(base, st.one_of(regular, regular, other), min_size=1, max_size=6),
    # names the spool does not own: a leading ".", or a "~" that no attempts follow
    "strangers": st.lists(st.tuples(st.sampled_from([b".", b"x~y"]), base, st.sampled_from(["file"] + KINDS)),
                          max_size=2, unique_by=lambda t: t[0] + t[1]),
    "planted_claim": st.booleans(),
    "kill": st.integers(0, 100),  # which regular file the first batch is killed at, modulo their number
    "max_attempts": st.integers(1, 3),
})


def make(kind, path, outside, content=b"{}"):
    if kind == "file":
        path.write_bytes(content)
    elif kind == "link":
        os.symlink(outside / "secret", path)
    elif kind == "dangling link":
        os.symlink("/nonexistent", path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        os.mkdir(path)
        (path / "inner~1").write_bytes(b"{}")


def kind_of(path):
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "dangling link" if os.readlink(path) == b"/nonexistent" else "link"
    return {stat.S_IFIFO: "fifo", stat.S_IFDIR: "folder", stat.S_IFREG: "file"}[stat.S_IFMT(info.st_mode)]


def names(folder):
    return sorted(os.listdir(bytes(folder)))


def noting(top, name):
    """Whether a running batch notes name (its claimed name, in hex) as the file at work."""
    for entry in os.scandir(top / "claims"):
        if entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError), open(os.path.join(entry.path, "lock"), "rb") as lock:
                if lock.read() == name.hex().encode() + b"\n":
                    return True
    return False


def run(top, *arguments):
    """One batch to its end, or killed at BATCH_S and the test failed."""
    process = start(top, *arguments)
    try:
        _out, err = process.communicate(timeout=BATCH_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _out, err = process.communicate()
        raise AssertionError("a batch hung: %s" % err) from None
    assert process.returncode in (0, 1, 75), err
    return err


def kill_at(top, name, arguments):
    """Start a batch, SIGKILL it (and the work's process) once it notes name."""
    process = start(top, *arguments)
    try:
        wait_for(lambda: noting(top, name) and children(process.pid) or process.poll() is not None, BATCH_S,
                 "the batch to work at %r" % name)
        assert process.poll() is None, process.communicate()[1]
        workers = children(process.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it ended already: the test fails above
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=BATCH_S)
    for pid in workers:  # it dies with its batch; this makes sure
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def drained(top):
    """Nothing the spool owns is left in incoming/ nor in claims/."""
    owned = [n for n in os.listdir(top / "incoming") if batchq_spool.parse(n)]
    return not owned and not os.listdir(top / "claims")


def all_due(top):
    now_ms = time.time() * 1000
    return all(batchq_spool.parse(n)[2] <= now_ms for n in os.listdir(top / "incoming") if batchq_spool.parse(n))


def content(spec, killed):
    """What a regular file holds: the stand-in's faults it asks for."""
    faults = {"fail": True} if spec["fails"] else {}
    if killed:
        faults.update(sleep=60, sleep_attempts=1)  # its first attempt outlasts its batch
    return json.dumps(faults).encode()


def check(top, outside, case, before, killed, secret_digest):
    owned, max_attempts = case["owned"], case["max_attempts"]
    files = {name: spec for name, spec in owned.items() if spec["kind"] == "file"}
    # the killed attempt counts: with one attempt, that file is dead
    failing = {name for name, spec in files.items() if spec["fails"] or spec["in_done"]
               or (name == killed and max_attempts == 1)}
    # failed/: the regular files after their last attempt, everything else the spool owns unchanged
    wanted = sorted([name + b"~%d" % max_attempts for name in failing]
                    + [name for name, spec in owned.items() if spec["kind"] != "file"]
                    + ([b"planted"] if case["planted_claim"] else []))
    assert names(top / "failed") == wanted
    for name, spec in owned.items():
        if spec["kind"] != "file":
            assert kind_of(bytes(top / "failed") + b"/" + name) == spec["kind"], name
    # done/: the others, each with its own digest, done by one batch; what held a name there is untouched
    results = {}
    for name in names(top / "done"):
        path = bytes(top / "done") + b"/" + name
        if stat.S_ISREG(os.lstat(path).st_mode):
            with open(path, "rb") as handle:
                results[name] = json.load(handle)
        else:
            assert files[name]["in_done"] == kind_of(path), name
    assert sorted(results) == sorted(set(files) - failing)
    for name, result in results.items():
        digest = hashlib.sha256(content(files[name], name == killed)).hexdigest()
        assert result["sha256"] == digest != secret_digest, (name, result)
        assert result["attempt"] == (2 if name == killed else 1), (name, result)
    ends = [r for r in records(top) if r["event"] == "end"]
    assert not [r for r in ends if r["redone"]]
    for name, result in results.items():
        doers = [r["batch"] for r in ends if os.fsdecode(name) + "~%d" % result["attempt"] in r["done"]]
        ended = {r["batch"] for r in ends}
        assert doers == ([result["by"]] if result["by"] in ended else []), (name, doers, result["by"])
    # names the spool does not own are where they were, as they were
    assert names(top / "incoming") == sorted(prefix + rest for prefix, rest, _kind in case["strangers"])
    for prefix, rest, kind in case["strangers"]:
        assert kind_of(bytes(top / "incoming") + b"/" + prefix + rest) == kind
    assert names(top / "claims") == []
    assert snapshot(outside) == before


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan)
@example({"owned": {b"a\nb": {"kind": "file", "fails": False, "in_done": None},
                    b"\xff\r": {"kind": "file", "fails": False, "in_done": "fifo"},
                    b"c": {"kind": "dangling link"}, b"d": {"kind": "fifo"}},
          "strangers": [(b".", b"e", "link")], "planted_claim": True, "kill": 0, "max_attempts": 2})
def test_hostile_files_never_stall_nor_escape_the_spool(case):
    work = Path(tempfile.mkdtemp())
    try:
        top, outside = work / "spool", work / "outside"
        for folder in batchq_spool.FOLDERS:
            (top / folder).mkdir(parents=True)
        (work / "state").mkdir()
        outside.mkdir()
        (outside / "secret").write_bytes(b'{"n": "secret"}')
        (outside / "claim").mkdir()
        (outside / "claim" / "lock").write_bytes(b"")
        for name in ("x~1", "y~2~5", ".result"):
            (outside / "claim" / name).write_bytes(b"{}")
        before = snapshot(outside)
        secret_digest = hashlib.sha256((outside / "secret").read_bytes()).hexdigest()

        incoming, done = bytes(top / "incoming") + b"/", bytes(top / "done") + b"/"
        regulars = sorted(name for name, spec in case["owned"].items() if spec["kind"] == "file")
        killed = regulars[case["kill"] % len(regulars)] if regulars else None
        for name, spec in case["owned"].items():
            make(spec["kind"], Path(os.fsdecode(incoming + name)), outside,
                 spec["kind"] == "file" and content(spec, name == killed))
            if spec["kind"] == "file" and spec["in_done"]:
                make(spec["in_done"], Path(os.fsdecode(done + name)), outside)
        for prefix, rest, kind in case["strangers"]:
            make(kind, Path(os.fsdecode(incoming + prefix + rest)), outside)
        if case["planted_claim"]:
            os.symlink(outside / "claim", top / "claims" / "planted")

        arguments = ["--limit", "100", "--max-attempts", str(case["max_attempts"]), "--job-timeout", "30"]
        if killed:
            kill_at(top, killed + b"~1", arguments)
        for _batch in range(len(case["owned"]) * case["max_attempts"] + 3):
            wait_for(lambda: all_due(top), 10, "the files put back to be due")
            if drained(top):
                break
            run(top, *arguments)
        assert drained(top), names(top / "incoming")
        check(top, outside, case, before, killed, secret_digest)
    finally:
        shutil.rmtree(work)
