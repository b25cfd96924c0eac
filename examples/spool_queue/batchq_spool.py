# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A spool directory of files as a batchq_queue Backend. Python 3.9+, standard library only.

batchq_queue.py runs the batch: the work of each file in a child process
with --job-timeout, the backoff, the dead files, the exit codes. This
module says how a spool keeps that contract.

The spool (one file system) holds
  tmp/       where producers write a file (batchq-spool-enqueue does it so)
  incoming/  where they move it once it is whole and synced, never over a file
  claims/    one folder per running batch, with its lock file
  done/      the result of each file done, under the file's name
  failed/    files that failed --max-attempts attempts, as NAME~ATTEMPTS
A file's name carries its attempts and, once put back after a failure, the
time it is due again: NAME, NAME~ATTEMPTS, NAME~ATTEMPTS~DUE (milliseconds
since the epoch). Producers' names never contain "~" nor start with ".",
and leave room for that suffix: at most NAME_MAX (255 bytes on most file
systems) less 20 bytes. A batch says on stderr which files of incoming/ break
these rules; it never claims them. A file whose name is too long to carry its
attempts is moved to failed/ unchanged, before any work.

A job is one file: its id is the file's name, its payload the path of the
claimed file (the work opens it), its handle the claimed name.

A batch makes its claim folder (a unique one, by mkdtemp) and holds an
exclusive flock on the lock file in it for its whole life. The children that
run the work close their copy of it: the lock ends with the batch. A batch
first takes back the claims of batches that are no longer running (their
lock is free: a lock does not outlive its process, nor a reboot), then
claims up to --limit due files, in name order, each by one rename() from
incoming/ into its folder that adds one attempt: only one rename of a name
succeeds, so concurrent batches never share a file, and the attempt is
counted before any work, whatever kills the batch later. Before each file's
work it notes the file's name in its lock file (synced, so that the note
survives a power loss too); once the file's result is in done/ on disk, the
file leaves the claim folder at once and the note is cleared. A claim taken
back thus holds only files not finished: the noted one counts as a failed
attempt, the others (all of them when no note names a file there) get their
attempt back. A file whose result is already in done/ is never charged nor
done again.

A failed attempt goes back to incoming/, due after the library's backoff;
a dead file goes to failed/. A batch stopped (SIGTERM, --max-seconds) puts
back the files it had not started with their attempt given back; a file
whose work a stop ended keeps its attempt. The spool can give attempts
back, unlike SQS, because its note says which file was at work: that one
is always charged, so no file can make batches fail for ever. An error of
the spool itself (a full disk, a read-only spool) fails the batch (exit 1);
at its end, a file it worked on and could not move on is put back as a
failed attempt, the others get theirs back.

Names must be unique for ever: no move replaces a file (rename() after a
check that the name is free), and a result never replaces another file's
(link(), of the consumer's own file). A file whose name is taken where it
should go (a newer file of that name in incoming/, the result of another
file of that name in done/) goes to failed/ instead, under NAME~ATTEMPTS~MS,
with an error on stderr.

File data are synced before a move makes them visible, and both
directories after moves, before a step that relies on them (a result is in
done/ on disk before its file leaves the claim folder).

Its own records (batches.jsonl in $STATE_DIRECTORY, the older ones in
batches.jsonl.1) say what each batch claimed, took back and did, file by
file; a record that cannot be written is a warning on stderr, never a
failure.
"""

import contextlib
import errno
import fcntl
import json
import os
import re
import socket
import sys
import tempfile
import time

import batchq_queue

FOLDERS = ("tmp", "incoming", "claims", "done", "failed")
LOCK = "lock"
RECORDS = "batches.jsonl"
# NAME, NAME~ATTEMPTS or NAME~ATTEMPTS~DUE
SPOOL_NAME = re.compile(r"(?P<base>[^~/.][^~/]*)(?:~(?P<attempts>[0-9]+)(?:~(?P<due>[0-9]+))?)?")
# A claim folder without a lock file is one a batch is making (the lock comes
# next) or one a takeover left empty; it is removed after this long.
STALE_S = 600
# The longest suffix a name carries: "~1000~" (batchq_queue.MOST_ATTEMPTS) and a due time of 13 digits, with a margin.
SUFFIX_BYTES = 20


def add_options(parser):
    parser.add_argument("--spool", required=True, help="the spool's top folder")
    parser.add_argument("--records-bytes", type=int, default=1 << 20,
                        help="size of batches.jsonl at which it becomes batches.jsonl.1")


def check(args):
    """What is wrong with the spool's options; None when nothing is."""
    if args.records_bytes < 4096:
        return "--records-bytes: must be at least 4096, got %s" % args.records_bytes
    missing = [folder for folder in FOLDERS if not os.path.isdir(os.path.join(args.spool, folder))]
    if missing:
        return "--spool: must be a spool, with the folders %s; %s has no %s" % (
            ", ".join(FOLDERS), args.spool, ", ".join(missing))
    return None


def parse(name):
    """(base, attempts, due in ms or 0) of a spool file's name, None for a name the spool does not own."""
    match = SPOOL_NAME.fullmatch(name)
    if not match:
        return None
    return match.group("base"), int(match.group("attempts") or 0), int(match.group("due") or 0)


def spool_name(base, attempts, due_ms=0):
    if not attempts:
        return base
    return "%s~%d~%d" % (base, attempts, due_ms) if due_ms else "%s~%d" % (base, attempts)


def due_names(names, now_ms):
    """The names of incoming/ that a claim may take, in the order it takes them."""
    return [name for name in sorted(names) if parse(name) and parse(name)[2] <= now_ms]


def fit(base, suffix, longest):
    """base, cut (on a character boundary) so that base + suffix has at most longest bytes."""
    room = longest - len(os.fsencode(suffix))
    while len(os.fsencode(base)) > room:
        base = base[:-1]
    return base + suffix


def batch_name():
    """host/consumer@instance/invocation#batch: who did a file, in its result and in the records."""
    consumer = os.environ.get("BATCHQ_CONSUMER", "spool")
    if os.environ.get("BATCHQ_INSTANCE"):
        consumer += "@" + os.environ["BATCHQ_INSTANCE"]
    invocation = os.environ.get("INVOCATION_ID", "")[:12] or "pid%d" % os.getpid()
    return "%s/%s/%s#%s" % (socket.gethostname(), consumer, invocation, os.environ.get("BATCHQ_BATCH", "1"))


def record(event, limit, **fields):
    """Append one line to the consumer's records, shared by its instances.

    One write under an exclusive lock of the file; at limit bytes the file
    becomes batches.jsonl.1 (replacing the one before), and a writer that finds
    its file renamed appends to the new one: at most about twice limit on disk.
    Never raises: the records tell what happened, a batch must not fail (and
    charge its files) for want of them."""
    directory = os.environ.get("STATE_DIRECTORY")
    if not directory:
        return
    path = os.path.join(directory.split(":")[0], RECORDS)
    line = (json.dumps(dict(fields, event=event, batch=batch_name(), time=time.time())) + "\n").encode()
    try:
        batchq_queue.append_record(path, line, limit)
    except OSError as exc:
        print("warning: no %s record in %s: %s" % (event, path, exc), file=sys.stderr)


def sync_dirs(*paths):
    """Make the renames into and out of these folders durable."""
    for path in sorted(set(paths)):
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def move(source, target):
    """rename(), never over another file: raises FileExistsError when the
    target's name is taken. False when the source is gone (another batch
    took it). Not link() and unlink(), which would make the check atomic:
    the kernel lets only a file's owner link it (fs.protected_hardlinks),
    and producers own theirs. Between the check and the rename, only a
    producer that breaks the rule of unique names can slip a file in."""
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, "another file has this name", target)
    try:
        os.rename(source, target)
    except FileNotFoundError:
        return False
    return True


def note(lock, name):
    """Write name (or nothing) in the lock file: what a takeover counts as this
    batch's attempt. The name first, then the length: a reader sees a whole
    name, or a longer one cut at its first line."""
    data = os.fsencode(name) + b"\n" if name else b""
    os.pwrite(lock, data, 0)
    os.ftruncate(lock, len(data))


def noted(lock):
    data = os.pread(lock, 4096, 0)
    return os.fsdecode(data.split(b"\n", 1)[0]) if b"\n" in data else ""


def identity(path):
    """What tells a file from another of its name: its inode and its mtime,
    which rename() and link() keep (the inode alone may be reused)."""
    stat = os.stat(path)
    return "%d:%d" % (stat.st_ino, stat.st_mtime_ns)


def has_result(done, base, file_id):
    """Whether done/BASE holds the result of the file of this identity (the same file, done before)."""
    try:
        with open(os.path.join(done, base), "rb") as handle:
            return json.load(handle).get("file") == file_id
    except (OSError, ValueError, AttributeError):
        return False


def result_text(result, **about):
    """The line done/ keeps: the work's result (an object, or any JSON value
    under "result") and what says which file and attempt it is."""
    value = json.loads(result)
    line = dict(value) if isinstance(value, dict) else {"result": value}
    line.update(about)
    return json.dumps(line, sort_keys=True) + "\n"


def write_result(folder, done, base, file_id, text):
    """The result (text, of the file of identity file_id) as done/BASE, whole
    and on disk, never over another file's result. False when done/BASE is the
    result of this very file, written by an attempt that died before the file
    left its claim: that result stays. Raises FileExistsError when it is
    another file's."""
    scratch = os.path.join(folder, ".result")
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    try:
        os.fchmod(descriptor, 0o640)  # readable by the spool's group, whatever the umask
        os.write(descriptor, text.encode())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    try:
        os.link(scratch, os.path.join(done, base))
    except FileExistsError:
        if not has_result(done, base, file_id):
            raise
        return False
    finally:
        os.unlink(scratch)
    sync_dirs(done)
    return True


# The lock descriptors of the batches this process runs.
LOCKS = set()


def close_locks():
    """In a job's child: close the locks, so that a lock ends with its batch, not with a job left running."""
    for descriptor in LOCKS:
        with contextlib.suppress(OSError):
            os.close(descriptor)
    LOCKS.clear()


os.register_at_fork(after_in_child=close_locks)


def backend(args):
    return SpoolBackend(args)


class SpoolBackend(batchq_queue.Backend):
    """One batch's view of a spool. args: the parsed options (--spool, --max-attempts, the backoff, --records-bytes)."""

    def __init__(self, args):
        self.args = args
        self.paths = {folder: os.path.join(args.spool, folder) for folder in FOLDERS}
        try:
            self.name_max = os.pathconf(self.paths["incoming"], "PC_NAME_MAX")
        except (OSError, ValueError):
            self.name_max = 255
        self.folder = self.lock = None
        self.started = set()  # the claimed names whose work started
        self.did = {"claimed": [], "done": [], "redone": [], "errors": [], "left": [], "taken": [], "error": None}

    @contextlib.contextmanager
    def failing(self, step):
        """An OSError in step is the spool's: a QueueError for the library, and the batch's error for the records."""
        try:
            yield
        except OSError as exc:
            text = batchq_queue.clean_text("%s: %s" % (step, exc))
            self.did["error"] = self.did["error"] or text
            raise batchq_queue.QueueError(text)

    # The library's calls

    def claim(self, limit):
        strangers, too_long = [], []
        try:
            with self.failing("claim"):
                self.folder, self.lock = self.open_claim()
                LOCKS.add(self.lock)
                self.did["taken"] = self.take_back()
                names = self.claim_files(limit, strangers, too_long)
        except batchq_queue.QueueError:
            self.record_end()
            raise
        record("claim", self.args.records_bytes, folder=os.path.basename(self.folder), names=names,
               taken_back=self.did["taken"], strangers=strangers[:10], too_long=too_long)
        self.did["claimed"] = names
        return [batchq_queue.Job(parse(name)[0], os.path.join(self.folder, name), parse(name)[1], handle=name)
                for name in names]

    def start(self, job):
        with self.failing("start"):
            note(self.lock, job.handle)
            os.fdatasync(self.lock)  # the note outlives a power loss: a file that takes the host down is charged
        self.started.add(job.handle)

    def has_result(self, job):
        with self.failing("has_result"):
            return has_result(self.paths["done"], job.id, identity(job.payload))

    def done(self, job, result):
        with self.failing("done"):
            fresh = False
            if result is not None:
                text = result_text(result, name=job.id, attempt=job.attempts, by=batch_name(),
                                   file=identity(job.payload))
                try:
                    fresh = write_result(self.folder, self.paths["done"], job.id, identity(job.payload), text)
                except FileExistsError:
                    # place() finds done/NAME taken: the file goes to failed/, and stderr says why
                    self.place(job.payload, os.path.join(self.paths["done"], job.id))
                    self.did["errors"].append({"name": job.handle, "error": "done/ holds another file's result"})
                    raise
            # Its result is on disk: the file leaves the claim, and a takeover never sees it again.
            os.unlink(job.payload)
            sync_dirs(self.folder)
            note(self.lock, None)
        self.did["done" if fresh else "redone"].append(job.handle)

    def failed(self, job, error, delay):
        print("%s: attempt %d failed: %s" % (job.id, job.attempts, error), file=sys.stderr)
        self.put(job, os.path.join(self.paths["incoming"], spool_name(job.id, job.attempts,
                                                                      int((time.time() + delay) * 1000))), error)

    def dead(self, job, error):
        # A file claimed past its last attempt (put back by a stop at its last one) used no attempt more.
        attempts = min(job.attempts, self.args.max_attempts)
        print("%s: attempt %d failed: %s (failed for good)" % (job.id, attempts, error), file=sys.stderr)
        self.put(job, os.path.join(self.paths["failed"], spool_name(job.id, attempts)), error)

    def release(self, jobs):
        with self.failing("release"):
            for job in jobs:
                # A file not started gets its attempt back; one whose work a stop ended keeps it.
                attempts = job.attempts if job.handle in self.started else job.attempts - 1
                self.place(job.payload, os.path.join(self.paths["incoming"], spool_name(job.id, attempts)))
                self.did["left"].append(job.handle)
            sync_dirs(self.paths["incoming"], self.paths["failed"], self.folder)

    def finish(self):
        """Put back what is still claimed (a file whose outcome the spool failed to keep), remove the claim folder."""
        if self.folder is None:
            return
        try:
            with self.failing("finish"):
                emptied = self.empty(self.folder, self.started)
                self.did["left"] += emptied["refunded"]
                self.did["errors"] += [{"name": name, "error": self.did["error"]}
                                       for name in emptied["counted"] + emptied["failed"]]
        finally:
            LOCKS.discard(self.lock)
            os.close(self.lock)
            self.record_end()

    def more(self):
        with self.failing("more"):
            return bool(due_names(os.listdir(self.paths["incoming"]), int(time.time() * 1000)))

    # The spool's own steps

    def put(self, job, target, error):
        """Move a failed or dead file on, out of the claim; a clash sends it to failed/ too."""
        with self.failing("put back"):
            self.place(job.payload, target)
            sync_dirs(os.path.dirname(target), self.paths["failed"], self.folder)
            note(self.lock, None)
        self.did["errors"].append({"name": job.handle, "error": error})

    def record_end(self):
        did = self.did
        outcome = "error" if did["error"] else "terminated" if batchq_queue.TERM["asked"] else "finished"
        taken_back = sum(len(t["counted"]) + len(t["refunded"]) + len(t["failed"]) for t in did["taken"])
        record("end", self.args.records_bytes, outcome=outcome, claimed=len(did["claimed"]), done=did["done"],
               redone=did["redone"], failed=len(did["errors"]), errors=did["errors"], left=did["left"],
               taken_back=taken_back, error=did["error"])

    def place(self, source, target):
        """move() to target; when its name is another file's, to failed/ under
        a name of its own (NAME~ATTEMPTS~MS): "clash". False when the source is gone."""
        try:
            return move(source, target)
        except FileExistsError:
            base, attempts, _due = parse(os.path.basename(source))
            while True:
                aside = os.path.join(self.paths["failed"],
                                     fit(base, "~%d~%d" % (attempts, time.time() * 1000), self.name_max))
                print("%s: %s is another file's, not replaced (names must be unique); kept as %s"
                      % (base, target, aside), file=sys.stderr)
                with contextlib.suppress(FileExistsError):
                    return move(source, aside) and "clash"

    def open_claim(self):
        """Make this batch's claim folder and lock it for the batch's life: (folder, lock descriptor)."""
        own = "%s-%s-" % (os.environ.get("INVOCATION_ID", "")[:12] or "pid%d" % os.getpid(),
                          os.environ.get("BATCHQ_BATCH", "1"))
        for _tries in range(3):
            # unique even where a stale folder has this batch's words (no INVOCATION_ID, a pid used again)
            folder = tempfile.mkdtemp(prefix=own, dir=self.paths["claims"])
            lock = os.path.join(folder, LOCK)
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                # A takeover may have found the lock before this batch held it, and removed the folder.
                if os.stat(lock).st_ino == os.fstat(descriptor).st_ino:
                    sync_dirs(self.paths["claims"])
                    return folder, descriptor
            os.close(descriptor)
        raise OSError(errno.EAGAIN, "could not keep a claim folder", self.paths["claims"])

    def take_back(self):
        """Empty the claim folders whose batch no longer runs; returns what each held."""
        taken = []
        for entry in sorted(os.listdir(self.paths["claims"])):
            folder = os.path.join(self.paths["claims"], entry)
            if folder == self.folder or entry.startswith("."):
                continue
            try:
                descriptor = os.open(os.path.join(folder, LOCK), os.O_RDWR)
            except (FileNotFoundError, NotADirectoryError):
                with contextlib.suppress(OSError):  # not empty, gone, or made a moment ago
                    if time.time() - os.lstat(folder).st_mtime > STALE_S:
                        os.rmdir(folder)
                continue
            try:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its batch is running
                try:
                    if os.stat(os.path.join(folder, LOCK)).st_ino != os.fstat(descriptor).st_ino:
                        continue
                except FileNotFoundError:
                    continue  # another batch took it back first
                working = noted(descriptor)
                taken.append(dict(self.empty(folder, {working}), working=working))
            finally:
                os.close(descriptor)
        return taken

    def empty(self, folder, charged):
        """Put back the files of a claim folder: those in charged count a
        failed attempt, the others get theirs back (a file whose result is in
        done/ already leaves without either); then remove the folder. Returns
        what it held."""
        counted, refunded, failed, finished = [], [], [], []
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name == LOCK:
                continue
            parsed = parse(name)
            if parsed is None:  # a result being written when the batch died
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
            base, attempts, _due = parsed
            with contextlib.suppress(FileNotFoundError):
                if has_result(self.paths["done"], base, identity(path)):
                    # its result was in done/ when the batch died, before the file left the claim
                    os.unlink(path)
                    finished.append(name)
                    continue
            if name not in charged:
                # not started: its attempt is given back, and it is due at once
                target, outcome = os.path.join(self.paths["incoming"], spool_name(base, attempts - 1)), refunded
            elif attempts >= self.args.max_attempts:
                target, outcome = os.path.join(self.paths["failed"], spool_name(base, attempts)), failed
            else:
                delay = batchq_queue.backoff(attempts, self.args.backoff_min, self.args.backoff_max)
                due = int((time.time() + delay) * 1000)
                target, outcome = os.path.join(self.paths["incoming"], spool_name(base, attempts, due)), counted
            placed = self.place(path, target)
            if placed:
                (failed if placed == "clash" else outcome).append(name)
        sync_dirs(self.paths["incoming"], self.paths["failed"], folder)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, LOCK))
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(folder)
        sync_dirs(self.paths["claims"])
        return {"folder": os.path.basename(folder), "counted": counted, "refunded": refunded,
                "failed": failed, "finished": finished}

    def strangers(self, names):
        """The names of incoming/ the spool does not own; said on stderr, never claimed."""
        found = sorted(name for name in names if parse(name) is None)
        if found:
            print("%d files in incoming/ are never claimed: a name must not contain '~' nor start with '.' "
                  "(e.g. %s)" % (len(found), json.dumps(found[0])), file=sys.stderr)
        return found

    def too_long(self, name):
        """Move a file whose name cannot carry its attempts to failed/, as it is."""
        print("%s: the name is too long to carry its attempts (at most %d bytes); moved to failed/"
              % (json.dumps(name), self.name_max - SUFFIX_BYTES), file=sys.stderr)
        return self.place(os.path.join(self.paths["incoming"], name), os.path.join(self.paths["failed"], name))

    def claim_files(self, limit, strangers, long_names):
        """Rename up to limit due files into the claim folder, one attempt more
        each. The names the spool does not own go to strangers, files moved to
        failed/ for a name too long to long_names."""
        claimed = []
        names = os.listdir(self.paths["incoming"])
        strangers.extend(self.strangers(names))
        for name in due_names(names, int(time.time() * 1000)):
            if len(claimed) >= limit or batchq_queue.TERM["asked"]:
                break
            base, attempts, _due = parse(name)
            if len(os.fsencode(base)) > self.name_max - SUFFIX_BYTES:
                if self.too_long(name):
                    long_names.append(name)
                continue
            target = spool_name(base, attempts + 1)
            if target in claimed:
                continue  # two files of one name (names must be unique): the other waits for another batch
            # rename() alone: of the batches that try, only one gets the file, into its own folder
            with contextlib.suppress(FileNotFoundError):
                os.rename(os.path.join(self.paths["incoming"], name), os.path.join(self.folder, target))
                claimed.append(target)
        if claimed:
            sync_dirs(self.folder, self.paths["incoming"])
        return claimed
