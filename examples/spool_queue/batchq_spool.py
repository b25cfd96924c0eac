# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A spool directory of files as a batchq_queue Backend. Python 3.9+, standard library only.

batchq_queue.py runs the batch: the work of the files in a child process
with --job-timeout, the backoff, the dead files, the exit codes. This
module says how a spool keeps that contract.

The spool (one file system) holds
  tmp/       where producers write a file (batchq-spool-enqueue does it so)
  incoming/  where they move it once it is whole and synced, never over a file
  claims/    one folder per running batch, with its lock file
  done/      the result of each file done, under the file's name
  failed/    files that failed --max-attempts attempts, as NAME~ATTEMPTS,
             and what was no regular file (see Hostile files)
A file's name carries its attempts and, once put back after a failure, the
time it is due again: NAME, NAME~ATTEMPTS, NAME~ATTEMPTS~DUE (milliseconds
since the epoch). Producers' names never contain "~" nor start with ".",
and leave room for that suffix: at most NAME_MAX (255 bytes on most file
systems) less 20 bytes. Any other byte is allowed: a newline, a CR, bytes
that are not UTF-8. A batch says on stderr which files of incoming/ break
these rules; it never claims them. A file whose name is too long to carry its
attempts is moved to failed/ unchanged, before any work.

A job is one file: its id is the file's name, its payload the path of the
claimed file (the work opens it), its handle the claimed name.

Hostile files. Every member of the spool's group can write in it, so a
batch trusts nothing it finds there. It never follows a link. It opens each
folder once, with O_NOFOLLOW, and names files relative to that descriptor.
It checks a file's kind with lstat() before it opens it, so it never opens
a FIFO or a device. It claims regular files only. Anything else in
incoming/ under a name the spool owns (a link, a dangling link, a FIFO, a
folder, a socket) goes to failed/ unchanged, before any work, with one line
on stderr. So does a link or a file planted in claims/, and a file swapped
for something else at its claim. The file the work opens is a regular file
that the batch moved into its own folder (mode 0700). A batch reads a name
of done/ only when it is a regular file, and at most RESULT_MOST bytes of
it. An error of one file (a folder that is not the batch's to move) leaves
that file where it is, said on stderr: it never stops the spool. Nothing
outside the spool is ever read, moved or deleted.

A batch makes its claim folder (a unique one) and holds an exclusive flock
on the lock file in it for its whole life. The worker process that runs the
work closes its copy of it: the lock ends with the batch. A batch
first takes back the claims of batches that are no longer running (their
lock is free: a lock does not outlive its process, nor a reboot), then
claims up to --limit due files, in name order, each by one rename() from
incoming/ into its folder that adds one attempt: only one rename of a name
succeeds, so concurrent batches never share a file, and the attempt is
counted before any work, whatever kills the batch later. Before each file's
work it notes the file's name in its lock file (its bytes in hex, so that
any name is noted whole; synced, so that the note survives a power loss
too); once the file's result is in done/ on disk, the file leaves the claim
folder at once and the note is cleared. A claim taken back thus holds only
files not finished: the noted one counts as a failed attempt, the others
(all of them when no note names a file there) get their attempt back. A
file whose result is already in done/ is never charged nor done again. A
claim folder whose lock is not a regular file is no batch's: it is left
alone, said on stderr.

A failed attempt goes back to incoming/, due after the library's backoff;
a dead file goes to failed/. A batch stopped (SIGTERM, --max-seconds) puts
back the files it had not started with their attempt given back; a file
whose work a stop ended keeps its attempt. The spool can give attempts
back, unlike SQS, because its note says which file was at work: that one
is always charged, so no file can make batches fail for ever. An error of
the spool itself (a full disk, a read-only spool) fails the batch (exit 1);
at its end, a file it worked on and could not move on is put back as a
failed attempt, the others get theirs back.

Names must be unique while done/ keeps their result. No move replaces a
file: rename() runs after a check that the name is free. A result never
replaces anything: it is a link() of the consumer's own file. A file whose
name is taken in incoming/ (a newer file of that name) or in failed/ goes
to failed/ under NAME~ATTEMPTS~MS instead, with an error on stderr. A file
whose name is taken in done/ (another file's result, or anything planted
there) has its result refused: done() raises batchq_queue.Refused. That
fails the file's attempt alone, and the batch goes on. After its last
attempt the file is in failed/.

done/ keeps each result --keep-done-days days (30 by default; 0 keeps them
for ever). A name may come back once its result is gone: it is then new
work. A batch that ends well (not failed, not stopped) removes the older
results, at most PRUNE_MOST of them. It first scans done/ with lstat(),
reading no file, at most once an hour: the time of the last whole scan is
in $STATE_DIRECTORY/done-pruned, which the consumer's instances share.
(Without $STATE_DIRECTORY, every batch scans.) Only regular files go; a link
or a folder in done/ is left for a person. To prune by hand, as root or as
the consumer's user (here the results older than 30 days):
  find SPOOL/done -maxdepth 1 -type f -mtime +30 -delete
find's -type f takes no link, and -delete follows none.

File data are synced before a move makes them visible, and both
directories after moves, before a step that relies on them (a result is in
done/ on disk before its file leaves the claim folder).

Its own records (batches.jsonl in $STATE_DIRECTORY, the older ones in
batches.jsonl.1) say what each batch claimed, took back, moved to failed/
and did, file by file; a record that cannot be written is a warning on
stderr, never a failure.
"""

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import socket
import stat
import sys
import time

import batchq_queue

FOLDERS = ("tmp", "incoming", "claims", "done", "failed")
LOCK = "lock"
# The result a batch writes in its claim folder, then links into done/.
SCRATCH = ".result"
RECORDS = "batches.jsonl"
# NAME, NAME~ATTEMPTS or NAME~ATTEMPTS~DUE
SPOOL_NAME = re.compile(r"(?P<base>[^~/.][^~/]*)(?:~(?P<attempts>[0-9]+)(?:~(?P<due>[0-9]+))?)?")
# A claim folder without a lock file is one a batch is making (the lock comes
# next) or one a takeover left empty; it is removed after this long.
STALE_S = 600
# The longest suffix a name carries: "~1000~" (batchq_queue.MOST_ATTEMPTS) and a due time of 13 digits, with a margin.
SUFFIX_BYTES = 20
# A result of ours is the work's result (at most batchq_queue.RESULT_BYTES) and a few fields:
# a file of done/ larger than this is not ours, and is never read whole.
RESULT_MOST = batchq_queue.RESULT_BYTES + (64 << 10)
# How long done/ keeps a result by default, in days.
KEEP_DONE_DAYS = 30.0
# $STATE_DIRECTORY/PRUNED holds the time of the last whole scan of done/; a batch scans it at most every PRUNE_EVERY_S.
PRUNED = "done-pruned"
PRUNE_EVERY_S = 3600
# A batch removes at most this many results; the next batch goes on.
PRUNE_MOST = 1000
# The errors that are the spool's own (a full disk, a read-only spool): they fail the batch.
# Any other error of one file (EACCES on a folder someone else owns, ELOOP) is that file's.
SPOOL_ERRNOS = {errno.EROFS, errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EMFILE, errno.ENFILE}


def add_options(parser):
    parser.add_argument("--spool", required=True, help="the spool's top folder")
    parser.add_argument("--records-bytes", type=int, default=1 << 20,
                        help="size of batches.jsonl at which it becomes batches.jsonl.1")
    parser.add_argument("--keep-done-days", type=float, default=KEEP_DONE_DAYS,
                        help="days done/ keeps a result; a batch removes older ones (0: kept for ever)")


def is_folder(path):
    """Whether path is a folder itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def check(args):
    """What is wrong with the spool's options; None when nothing is."""
    if args.records_bytes < 4096:
        return "--records-bytes: must be at least 4096, got %s" % args.records_bytes
    if not (math.isfinite(args.keep_done_days) and 0 <= args.keep_done_days <= 36500):
        return "--keep-done-days: must be 0 (kept for ever) to 36500 days, got %s" % args.keep_done_days
    missing = [folder for folder in FOLDERS if not is_folder(os.path.join(args.spool, folder))]
    if missing:
        return "--spool: must be a spool, with the folders %s (not links); %s has no %s" % (
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


def shown(name):
    """A name as stderr shows it, on one line: as it is when it is printable, else quoted with escapes."""
    return name if name.isprintable() else json.dumps(name)


def batch_name():
    """host/consumer@instance/invocation#batch: who did a file, in its result and in the records."""
    consumer = os.environ.get("BATCHQ_CONSUMER", "spool")
    if os.environ.get("BATCHQ_INSTANCE"):
        consumer += "@" + os.environ["BATCHQ_INSTANCE"]
    invocation = os.environ.get("INVOCATION_ID", "")[:12] or "pid%d" % os.getpid()
    return "%s/%s/%s#%s" % (socket.gethostname(), consumer, invocation, os.environ.get("BATCHQ_BATCH", "1"))


def state_path(name):
    """The path of a file of the consumer's own in $STATE_DIRECTORY (its first folder), None without one."""
    directory = os.environ.get("STATE_DIRECTORY")
    return os.path.join(directory.split(":")[0], name) if directory else None


def record(event, limit, **fields):
    """Append one line to the consumer's records, shared by its instances.

    One write under an exclusive lock of the file; at limit bytes the file
    becomes batches.jsonl.1 (replacing the one before), and a writer that finds
    its file renamed appends to the new one: at most about twice limit on disk.
    Never raises: the records tell what happened, a batch must not fail (and
    charge its files) for want of them."""
    path = state_path(RECORDS)
    if not path:
        return
    line = (json.dumps(dict(fields, event=event, batch=batch_name(), time=time.time())) + "\n").encode()
    try:
        batchq_queue.append_record(path, line, limit)
    except OSError as exc:
        print("warning: no %s record in %s: %s" % (event, path, exc), file=sys.stderr)


# Files and folders by descriptor: never through a link

def open_folder(name, folder=None):
    """A descriptor of the folder name (in the folder of descriptor folder), never through a link."""
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)


def lstat(folder, name):
    return os.stat(name, dir_fd=folder, follow_symlinks=False)


def kind(mode):
    """What a file is, for stderr."""
    names = {stat.S_IFLNK: "a link", stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
             stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFREG: "a regular file"}
    return names.get(stat.S_IFMT(mode), "of an unknown kind")


def open_regular(folder, name, flags=os.O_RDONLY):
    """A descriptor of the regular file name in folder, or None when it is anything else.

    lstat() first, so that a FIFO or a device is never opened (opening one may
    block, or have an effect). O_NOFOLLOW and O_NONBLOCK guard the moment
    between the two, and the file opened must be the one lstat() saw.
    Raises OSError when name is gone or cannot be opened."""
    seen = lstat(folder, name)
    if not stat.S_ISREG(seen.st_mode):
        return None
    descriptor = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=folder)
    opened = os.fstat(descriptor)
    if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino) or not stat.S_ISREG(opened.st_mode):
        os.close(descriptor)
        return None
    return descriptor


def read_most(descriptor, most):
    """The file's bytes, None when it holds more than most."""
    data = b""
    while len(data) <= most:
        chunk = os.read(descriptor, most + 1 - len(data))
        if not chunk:
            return data
        data += chunk
    return None


def move(source_folder, source, folder, target):
    """rename(), never over another file: raises FileExistsError when the
    target's name is taken. False when the source is gone (another batch
    took it). rename() moves a link itself, never what it points to. Not
    link() and unlink(), which would make the check atomic: the kernel lets
    only a file's owner link it (fs.protected_hardlinks), and producers own
    theirs. Between the check and the rename, only a producer that breaks the
    rule of unique names can slip a file in."""
    try:
        lstat(folder, target)
    except FileNotFoundError:
        pass
    else:
        raise FileExistsError(errno.EEXIST, "another file has this name", target)
    try:
        os.rename(source, target, src_dir_fd=source_folder, dst_dir_fd=folder)
    except FileNotFoundError:
        return False
    return True


def note(lock, name):
    """Write name (or nothing) in the lock file: what a takeover counts as this
    batch's attempt. The name's bytes in hex, so that a name with a newline is
    noted whole, then a newline. The note first, then the length: a reader sees
    a whole note, or a longer one cut, ending in the newline of the new one."""
    data = os.fsencode(name).hex().encode() + b"\n" if name else b""
    os.pwrite(lock, data, 0)
    os.ftruncate(lock, len(data))


def noted(lock):
    """The name the lock file notes, "" when none."""
    line, newline, _rest = os.pread(lock, 4096, 0).partition(b"\n")
    if not newline:
        return ""
    try:
        return os.fsdecode(bytes.fromhex(line.decode("ascii")))
    except ValueError:
        # The note of an older batchq_spool: the name as it is. A claimed name holds "~", which hex never does.
        return os.fsdecode(line)


def identity(info):
    """What tells a file from another of its name, from its lstat(): its inode
    and its mtime, which rename() and link() keep (the inode alone may be reused)."""
    return "%d:%d" % (info.st_ino, info.st_mtime_ns)


def has_result(done, base, file_id):
    """Whether done/BASE (done: the folder's descriptor) holds the result of the
    file of this identity (the same file, done before). Anything but a regular
    file there, or one larger than a result of ours, is not its result."""
    try:
        descriptor = open_regular(done, base)
    except OSError:
        return False
    if descriptor is None:
        return False
    try:
        data = read_most(descriptor, RESULT_MOST)
    except OSError:
        return False
    finally:
        os.close(descriptor)
    try:
        value = json.loads(data or b"")
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("file") == file_id


def result_text(result, **about):
    """The line done/ keeps: the work's result (an object, or any JSON value
    under "result") and what says which file and attempt it is."""
    value = json.loads(result)
    line = dict(value) if isinstance(value, dict) else {"result": value}
    line.update(about)
    return json.dumps(line, sort_keys=True) + "\n"


def write_result(folder, done, base, file_id, text):
    """The result (text, of the file of identity file_id) as done/BASE, whole
    and on disk, never over another file. folder and done are descriptors: the
    claim folder, where it is written first, and done/. False when done/BASE is
    the result of this very file, written by an attempt that died before the
    file left its claim: that result stays. Raises FileExistsError when the name
    is taken by anything else."""
    descriptor = os.open(SCRATCH, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640, dir_fd=folder)
    try:
        os.fchmod(descriptor, 0o640)  # readable by the spool's group, whatever the umask
        data = text.encode()
        while data:
            data = data[os.write(descriptor, data):]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    try:
        os.link(SCRATCH, base, src_dir_fd=folder, dst_dir_fd=done, follow_symlinks=False)
    except FileExistsError:
        if not has_result(done, base, file_id):
            raise
        return False
    finally:
        os.unlink(SCRATCH, dir_fd=folder)
    os.fsync(done)
    return True


def prune_done(done, before, most):
    """Remove the regular files of done/ (done: its descriptor) last changed
    before the time before, at most most of them: (how many, whether the scan
    saw every file). A file that cannot be removed stays, without a word."""
    removed = 0
    whole = True
    with os.scandir(done) as scan:
        for entry in scan:
            if removed >= most:
                whole = False
                break
            with contextlib.suppress(OSError):  # gone, or another user's in a sticky folder
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_mtime < before:
                    os.unlink(entry.name, dir_fd=done)
                    removed += 1
    if removed:
        os.fsync(done)
    return removed, whole


# The lock descriptors of the batches this process runs.
LOCKS = set()


def close_locks():
    """In the worker process: close the locks, so that a lock ends with its batch, not with a job left running."""
    for descriptor in LOCKS:
        with contextlib.suppress(OSError):
            os.close(descriptor)
    LOCKS.clear()


os.register_at_fork(after_in_child=close_locks)


def backend(args):
    return SpoolBackend(args)


class SpoolBackend(batchq_queue.Backend):
    """One batch's view of a spool. args: the parsed options (--spool, --max-attempts, the backoff,
    --records-bytes, --keep-done-days)."""

    def __init__(self, args):
        self.args = args
        self.paths = {folder: os.path.join(args.spool, folder) for folder in FOLDERS}
        try:
            self.name_max = os.pathconf(self.paths["incoming"], "PC_NAME_MAX")
        except (OSError, ValueError):
            self.name_max = 255
        self.fds = {}  # folder: descriptor, for the batch's life
        self.folder = self.lock = None  # the claim folder's name and its lock's descriptor; its own in fds["claim"]
        self.seen = {}  # claimed name: its lstat(), from the claim folder
        self.started = set()  # the claimed names whose work started
        self.did = {"claimed": [], "done": [], "redone": [], "errors": [], "left": [], "taken": [],
                    "error": None, "pruned": 0}

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
        strangers, too_long, quarantined = [], [], []
        try:
            with self.failing("claim"):
                self.open_folders()
                self.folder, self.fds["claim"], self.lock = self.open_claim()
                LOCKS.add(self.lock)
                self.did["taken"] = self.take_back()
                names = self.claim_files(limit, strangers, too_long, quarantined)
        except batchq_queue.QueueError:
            self.close()
            self.record_end()
            raise
        record("claim", self.args.records_bytes, folder=self.folder, names=names, taken_back=self.did["taken"],
               strangers=strangers[:10], too_long=too_long, quarantined=quarantined)
        self.did["claimed"] = names
        folder = os.path.join(self.paths["claims"], self.folder)
        return [batchq_queue.Job(parse(name)[0], os.path.join(folder, name), parse(name)[1], handle=name)
                for name in names]

    def start(self, job):
        with self.failing("start"):
            # The work opens the file by its path: the path must lead to the file this batch claimed.
            there, claimed = os.stat(job.payload, follow_symlinks=False), self.seen[job.handle]
            if (there.st_dev, there.st_ino) != (claimed.st_dev, claimed.st_ino):
                raise OSError(errno.EINVAL, "the path leads to another file: was a folder of the spool moved?",
                              job.payload)
            note(self.lock, job.handle)
            os.fdatasync(self.lock)  # the note outlives a power loss: a file that takes the host down is charged
        self.started.add(job.handle)

    def has_result(self, job):
        return has_result(self.fds["done"], job.id, identity(self.seen[job.handle]))

    def done(self, job, result):
        with self.failing("done"):
            fresh = False
            if result is not None:
                file_id = identity(self.seen[job.handle])
                text = result_text(result, name=job.id, attempt=job.attempts, by=batch_name(), file=file_id)
                try:
                    fresh = write_result(self.fds["claim"], self.fds["done"], job.id, file_id, text)
                except FileExistsError:
                    # Nothing is applied; the library fails this file's attempt, and the batch goes on.
                    raise batchq_queue.Refused(
                        "done/ holds another file's result under this name, or something that is no result "
                        "(names must be unique)") from None
            # Its result is on disk: the file leaves the claim, and a takeover never sees it again.
            os.unlink(job.handle, dir_fd=self.fds["claim"])
            os.fsync(self.fds["claim"])
            note(self.lock, None)
        self.did["done" if fresh else "redone"].append(job.handle)

    def failed(self, job, error, delay):
        print("%s: attempt %d failed: %s" % (shown(job.id), job.attempts, error), file=sys.stderr)
        self.put(job, "incoming", spool_name(job.id, job.attempts, int((time.time() + delay) * 1000)), error)

    def dead(self, job, error):
        # A file claimed past its last attempt (put back by a stop at its last one) used no attempt more.
        attempts = min(job.attempts, self.args.max_attempts)
        print("%s: attempt %d failed: %s (failed for good)" % (shown(job.id), attempts, error), file=sys.stderr)
        self.put(job, "failed", spool_name(job.id, attempts), error)

    def release(self, jobs):
        with self.failing("release"):
            for job in jobs:
                # A file not started gets its attempt back; one whose work a stop ended keeps it.
                attempts = job.attempts if job.handle in self.started else job.attempts - 1
                self.place(self.fds["claim"], job.handle, "incoming", spool_name(job.id, attempts))
                self.did["left"].append(job.handle)
            self.sync("incoming", "failed", "claim")

    def finish(self):
        """Put back what is still claimed (a file whose outcome the spool failed to keep), remove the claim
        folder, then prune done/ unless the batch failed or was stopped."""
        if self.folder is None:
            return
        try:
            with self.failing("finish"):
                emptied = self.empty(self.folder, self.fds["claim"], self.started)
                self.did["left"] += emptied["refunded"]
                self.did["errors"] += [{"name": name, "error": self.did["error"]}
                                       for name in emptied["counted"] + emptied["failed"]]
            if not self.did["error"] and not batchq_queue.TERM["asked"]:
                self.did["pruned"] = self.prune()
        finally:
            self.close()
            self.record_end()

    def more(self):
        # finish() closed the folders: this opens incoming/ again, never through a link.
        with self.failing("more"):
            top = os.open(self.args.spool, os.O_RDONLY | os.O_DIRECTORY)
            try:
                incoming = open_folder("incoming", top)
                try:
                    return bool(due_names(os.listdir(incoming), int(time.time() * 1000)))
                finally:
                    os.close(incoming)
            finally:
                os.close(top)

    # The spool's own steps

    def open_folders(self):
        """A descriptor of each folder of the spool, none through a link: every later step names files
        relative to them. The top folder is the one --spool names, a link to it too."""
        top = os.open(self.args.spool, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for folder in FOLDERS:
                self.fds[folder] = open_folder(folder, top)
        finally:
            os.close(top)

    def close(self):
        if self.lock is not None:
            LOCKS.discard(self.lock)
            os.close(self.lock)
            self.lock = None
        for descriptor in self.fds.values():
            os.close(descriptor)
        self.fds = {}

    def sync(self, *folders):
        """Make the renames into and out of these folders (names of fds) durable."""
        for folder in sorted(set(folders)):
            os.fsync(self.fds[folder])

    def put(self, job, folder, target, error):
        """Move a failed or dead file on, out of the claim; a clash sends it to failed/ too."""
        with self.failing("put back"):
            self.place(self.fds["claim"], job.handle, folder, target)
            self.sync(folder, "failed", "claim")
            note(self.lock, None)
        self.did["errors"].append({"name": job.handle, "error": error})

    def record_end(self):
        did = self.did
        outcome = "error" if did["error"] else "terminated" if batchq_queue.TERM["asked"] else "finished"
        taken_back = sum(len(t["counted"]) + len(t["refunded"]) + len(t["failed"]) for t in did["taken"])
        record("end", self.args.records_bytes, outcome=outcome, claimed=len(did["claimed"]), done=did["done"],
               redone=did["redone"], failed=len(did["errors"]), errors=did["errors"], left=did["left"],
               taken_back=taken_back, error=did["error"], pruned=did["pruned"])

    def place(self, source_folder, source, folder, target):
        """move() the file source (in the folder of descriptor source_folder) to
        target in folder (a name of FOLDERS); when that name is another file's,
        to failed/ under a name of its own (NAME~ATTEMPTS~MS): "clash". False
        when the source is gone."""
        try:
            return move(source_folder, source, self.fds[folder], target)
        except FileExistsError:
            base, attempts, _due = parse(source) or (source, 0, 0)
            while True:
                aside = fit(base, "~%d~%d" % (attempts, time.time() * 1000), self.name_max)
                print("%s: %s/%s is another file's, not replaced (names must be unique); kept as failed/%s"
                      % (shown(base), folder, shown(target), shown(aside)), file=sys.stderr)
                with contextlib.suppress(FileExistsError):
                    return move(source_folder, source, self.fds["failed"], aside) and "clash"

    def quarantine(self, source_folder, source, where, target, mode, wanted="a regular file"):
        """Move what is not what a batch wants there to failed/ as target, never following it;
        stderr says why. True when it moved; an error leaves it where it is, said too."""
        try:
            moved = self.place(source_folder, source, "failed", target)
        except OSError as exc:
            if exc.errno in SPOOL_ERRNOS:
                raise
            print("%s/%s: not %s (%s), and it could not be moved to failed/: %s"
                  % (where, shown(source), wanted, kind(mode), exc.strerror), file=sys.stderr)
            return False
        if moved:
            print("%s: not %s (%s) in %s/; moved to failed/, never opened"
                  % (shown(target), wanted, kind(mode), where), file=sys.stderr)
        return bool(moved)

    def open_claim(self):
        """Make this batch's claim folder and lock it for the batch's life: (name, descriptor, lock descriptor)."""
        claims = self.fds["claims"]
        own = "%s-%s-" % (os.environ.get("INVOCATION_ID", "")[:12] or "pid%d" % os.getpid(),
                          os.environ.get("BATCHQ_BATCH", "1"))
        for _tries in range(3):
            # unique even where a stale folder has this batch's words (no INVOCATION_ID, a pid used again)
            name = own + os.urandom(6).hex()
            try:
                os.mkdir(name, 0o700, dir_fd=claims)
            except FileExistsError:
                continue
            folder = open_folder(name, claims)
            lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
            fcntl.flock(lock, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                # A takeover may have found the lock before this batch held it, and removed the folder.
                if lstat(folder, LOCK).st_ino == os.fstat(lock).st_ino:
                    os.fsync(claims)
                    return name, folder, lock
            os.close(lock)
            os.close(folder)
        raise OSError(errno.EAGAIN, "could not keep a claim folder", self.paths["claims"])

    def take_back(self):
        """Empty the claim folders whose batch no longer runs; returns what each held."""
        taken = []
        for entry in sorted(os.listdir(self.fds["claims"])):
            if entry == self.folder or entry.startswith("."):
                continue
            try:
                held = self.take_back_one(entry)
            except OSError as exc:
                if exc.errno in SPOOL_ERRNOS:
                    raise
                print("claims/%s: not taken back: %s" % (shown(entry), exc.strerror or exc), file=sys.stderr)
                continue
            if held is not None:
                taken.append(held)
        return taken

    def take_back_one(self, entry):
        """What the claim folder entry held, once taken back; None when its batch runs, or it is gone."""
        claims = self.fds["claims"]
        info = lstat(claims, entry)
        if not stat.S_ISDIR(info.st_mode):
            # a batch makes folders here: anything else was planted, and is never followed
            self.quarantine(claims, entry, "claims", entry, info.st_mode, wanted="a claim folder")
            return None
        folder = open_folder(entry, claims)
        try:
            try:
                lock = open_regular(folder, LOCK, os.O_RDWR)
            except FileNotFoundError:
                if time.time() - info.st_mtime > STALE_S:
                    with contextlib.suppress(OSError):  # not empty, or gone
                        os.rmdir(entry, dir_fd=claims)
                return None
            if lock is None:
                raise OSError(errno.EINVAL, "its lock is not a regular file: it is no batch's claim")
            try:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return None  # its batch is running
                try:
                    if lstat(folder, LOCK).st_ino != os.fstat(lock).st_ino:
                        return None
                except FileNotFoundError:
                    return None  # another batch took it back first
                working = noted(lock)
                return dict(self.empty(entry, folder, {working}), working=working)
            finally:
                os.close(lock)
        finally:
            os.close(folder)

    def empty(self, name, folder, charged):
        """Put back the files of the claim folder name (descriptor folder): those
        in charged count a failed attempt, the others get theirs back (a file
        whose result is in done/ already leaves without either), what is no
        regular file goes to failed/; then remove the folder. Returns what it held."""
        held = {"folder": name, "counted": [], "refunded": [], "failed": [], "finished": [], "quarantined": []}
        for entry in sorted(os.listdir(folder)):
            if entry == LOCK:
                continue
            try:
                self.empty_one(folder, entry, charged, held)
            except OSError as exc:
                if exc.errno in SPOOL_ERRNOS:
                    raise
                print("claims/%s/%s: left there: %s" % (shown(name), shown(entry), exc.strerror or exc),
                      file=sys.stderr)
        self.sync("incoming", "failed")
        os.fsync(folder)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(LOCK, dir_fd=folder)
        with contextlib.suppress(OSError):  # gone, or what could not move is left in it
            os.rmdir(name, dir_fd=self.fds["claims"])
        self.sync("claims")
        return held

    def empty_one(self, folder, entry, charged, held):
        info = lstat(folder, entry)
        if entry == SCRATCH and stat.S_ISREG(info.st_mode):  # a result being written when the batch died
            os.unlink(entry, dir_fd=folder)
            return
        parsed = parse(entry)
        if parsed is None or not stat.S_ISREG(info.st_mode):
            if self.quarantine(folder, entry, "claims", entry, info.st_mode):
                held["quarantined"].append(entry)
            return
        base, attempts, _due = parsed
        if has_result(self.fds["done"], base, identity(info)):
            # its result was in done/ when the batch died, before the file left the claim
            os.unlink(entry, dir_fd=folder)
            held["finished"].append(entry)
            return
        if entry not in charged:
            # not started: its attempt is given back, and it is due at once
            where, target, outcome = "incoming", spool_name(base, attempts - 1), "refunded"
        elif attempts >= self.args.max_attempts:
            where, target, outcome = "failed", spool_name(base, attempts), "failed"
        else:
            delay = batchq_queue.backoff(attempts, self.args.backoff_min, self.args.backoff_max)
            where, target, outcome = "incoming", spool_name(base, attempts, int((time.time() + delay) * 1000)), "counted"
        placed = self.place(folder, entry, where, target)
        if placed:
            held["failed" if placed == "clash" else outcome].append(entry)

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
        return self.place(self.fds["incoming"], name, "failed", name)

    def scan(self, quarantined):
        """The names of incoming/ that are regular files. Those of the others that
        the spool owns move to failed/ (and to quarantined)."""
        incoming = self.fds["incoming"]
        regular, others = [], []
        with os.scandir(incoming) as entries:
            for entry in entries:
                try:
                    is_file = entry.is_file(follow_symlinks=False)  # the kind the folder tells, or lstat()
                except OSError:
                    is_file = False
                (regular if is_file else others).append(entry.name)
        for name in sorted(others):
            with contextlib.suppress(FileNotFoundError):  # another batch moved it
                info = lstat(incoming, name)
                if parse(name) and not stat.S_ISREG(info.st_mode) and self.quarantine(
                        incoming, name, "incoming", name, info.st_mode):
                    quarantined.append(name)
        return regular, others

    def claim_files(self, limit, strangers, long_names, quarantined):
        """Rename up to limit due regular files into the claim folder, one
        attempt more each. The names the spool does not own go to strangers,
        files moved to failed/ for a name too long to long_names, what is no
        regular file (moved to failed/ too) to quarantined."""
        incoming, folder = self.fds["incoming"], self.fds["claim"]
        regular, others = self.scan(quarantined)
        strangers.extend(self.strangers(regular + others))
        claimed = []
        for name in due_names(regular, int(time.time() * 1000)):
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
            try:
                # rename() alone: of the batches that try, only one gets the file, into its own folder
                os.rename(name, target, src_dir_fd=incoming, dst_dir_fd=folder)
            except FileNotFoundError:
                continue  # another batch took it
            except OSError as exc:
                if exc.errno in SPOOL_ERRNOS:
                    raise
                print("%s: not claimed: %s" % (shown(name), exc.strerror or exc), file=sys.stderr)
                continue
            # In its folder (mode 0700, the batch's own) nobody else can swap it: check its kind once more.
            info = lstat(folder, target)
            if not stat.S_ISREG(info.st_mode):
                if self.quarantine(folder, target, "incoming", name, info.st_mode):
                    quarantined.append(name)
                continue
            self.seen[target] = info
            claimed.append(target)
        if claimed or quarantined:
            self.sync("claim", "incoming", "failed")
        return claimed

    def prune(self):
        """Remove the results older than --keep-done-days, at most PRUNE_MOST, once
        PRUNE_EVERY_S has passed since the last whole scan of done/; one batch at a
        time (a lock on $STATE_DIRECTORY/done-pruned, which holds that scan's time).
        Returns how many it removed. Never fails the batch: an error is a warning."""
        # A caller that makes args itself, not through add_options(), gets the default.
        days = getattr(self.args, "keep_done_days", KEEP_DONE_DAYS)
        if not days:
            return 0
        path = state_path(PRUNED)
        try:
            if not path:
                return prune_done(self.fds["done"], time.time() - days * 86400, PRUNE_MOST)[0]
            marker = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o640)
            try:
                if not stat.S_ISREG(os.fstat(marker).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file", path)
                try:
                    fcntl.flock(marker, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return 0  # another batch prunes
                try:
                    last = float(os.pread(marker, 64, 0))
                except ValueError:  # none yet
                    last = 0.0
                now = time.time()
                if 0 <= now - last < PRUNE_EVERY_S:
                    return 0
                removed, whole = prune_done(self.fds["done"], now - days * 86400, PRUNE_MOST)
                if whole:
                    text = b"%.3f\n" % now
                    os.pwrite(marker, text, 0)
                    os.ftruncate(marker, len(text))
                return removed
            finally:
                os.close(marker)  # and with it the lock
        except OSError as exc:
            print("warning: done/ not pruned: %s" % exc, file=sys.stderr)
            return 0
