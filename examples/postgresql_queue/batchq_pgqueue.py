# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A PostgreSQL job table (schema.sql) as a batchq_queue Backend.
Needs psycopg 3 or psycopg2 (Debian 11 packages only psycopg2).

Connects with libpq's usual environment (PGHOST, PGDATABASE, PGUSER, ...)
or BATCHQ_PG_DSN. The password is the run's systemd credential pgpassword
(the role's credentials: a file in $CREDENTIALS_DIRECTORY, never in the
environment), or else PGPASSWORD.

A batch works in two transactions on one connection:
1. The claim commits on its own. The jobs become 'running', claimed by this
   batch, with one more attempt counted. The count is durable before any
   work begins. So a batch that dies (SIGSEGV, out of memory, its timeout,
   its host lost) has used that attempt like a job that raises. A job that
   kills every batch ends 'dead' after --max-attempts.
2. The batch's transaction locks the jobs it claimed (FOR NO KEY UPDATE).
   Each job's outcome is written in it as the job ends: its result and
   'done', or 'queued' again after a backoff, or 'dead'. The commit at the
   end applies them all: a result is applied exactly once.
Each job's writes run under a savepoint of their own. A result the
database refuses (a constraint, a NUL byte) fails that job alone.
A 'running' job that no transaction holds a lock on has lost its batch
(the lock went with the batch's connection). The next claim takes it back
at once, CLAIM_GRACE after its claim at the earliest; or makes it 'dead'
when it has used its last attempt.

Jobs not started (SIGTERM, --max-seconds) go back 'queued' with that commit.
They keep their attempt, as the contract says.

Its own records (batches.jsonl in $STATE_DIRECTORY, the older ones in
batches.jsonl.1, at most about twice --records-bytes in all) say which jobs
each batch claimed and how it ended.
"""

import argparse
import contextlib
import json
import math
import os
import signal
import socket
import sys
import time

try:
    import psycopg
except ImportError:  # Debian 11 ships psycopg2 only; the calls below are common to both
    import psycopg2 as psycopg

import batchq_queue
from batchq_queue import QueueError, clean_text

# How quickly a dead peer's connection, and so its row locks, is given up on.
CONNECTION = {
    "connect_timeout": 10,
    # the client notices a silent server, and the server (postgresql.conf
    # tcp_keepalives_*) a silent client, in seconds rather than hours
    "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
    # unacknowledged data (a COMMIT sent into a cut cable) gives up after 10 s
    "tcp_user_timeout": 10000,
}
# A claim never waits for a lock; no statement runs away; a batch that stops
# talking mid-transaction (its process hung: its kernel still answers
# keepalives) is ended by the server, releasing its locks. The batch speaks at
# least once a second while its jobs work (keep_alive), so this bounds the
# batch's own pauses, not its work. Set once connected rather than as startup
# options, which a pooler may refuse (PgBouncer before 1.20 does); what the
# startup options set (PGOPTIONS, or options= in the DSN) stays as they set it.
SESSION = (("lock_timeout", "5s"), ("statement_timeout", "30s"), ("idle_in_transaction_session_timeout", "60s"))
# A claimed job is locked by its batch one round trip after the claim's
# commit; a 'running' job without a lock is taken back only this long after
# its claim, so that no claim takes a job in that round trip.
CLAIM_GRACE = 10
RECORDS = "batches.jsonl"

# The claim, one transaction: jobs whose batch died and that have no attempt
# left are dead; then the batch takes jobs whose batch died, and due ones.
BURY_ABANDONED = """
    UPDATE batchq_jobs SET state = 'dead', claimed_by = NULL,
                           last_error = 'its batch ended without finishing it, attempt ' || attempts || ' of ' || %(max)s
    WHERE id IN (SELECT id FROM batchq_jobs
                 WHERE queue = %(queue)s AND state = 'running' AND attempts >= %(max)s
                   AND claimed_at < now() - %(grace)s * interval '1 second'
                 FOR NO KEY UPDATE SKIP LOCKED)"""
# The payload as text: the job decodes it in its own process. A payload Python
# cannot decode (a 5000-digit number, arrays nested 5000 deep) fails that job
# alone, after its attempt is counted.
CLAIM = """
    WITH abandoned AS (
        SELECT id FROM batchq_jobs
        WHERE queue = %(queue)s AND state = 'running' AND claimed_at < now() - %(grace)s * interval '1 second'
        ORDER BY claimed_at LIMIT %(limit)s FOR NO KEY UPDATE SKIP LOCKED
    ), due AS (
        SELECT id FROM batchq_jobs
        WHERE queue = %(queue)s AND state = 'queued' AND run_at <= now()
        ORDER BY run_at, id LIMIT %(limit)s - (SELECT count(*) FROM abandoned) FOR NO KEY UPDATE SKIP LOCKED
    )
    UPDATE batchq_jobs SET state = 'running', attempts = attempts + 1, claimed_by = %(me)s, claimed_at = now()
    WHERE id IN (SELECT id FROM abandoned UNION ALL SELECT id FROM due)
    RETURNING id, payload::text, attempts"""
# The batch's transaction: the claimed jobs, locked until its end. It waits for
# a lock (lock_timeout): another claim that saw the job still queued holds its
# row lock until that claim's commit, milliseconds later; skipping it would
# leave the job running without a batch. No claim waits for a lock, so this
# wait never closes a cycle.
LOCK = """SELECT id FROM batchq_jobs WHERE id = ANY(%s::bigint[]) AND claimed_by = %s AND state = 'running'
          FOR NO KEY UPDATE"""
# clock_timestamp(), not now(): now() is when the batch's transaction began, and a job that
# failed during the batch with no backoff is due from the moment it failed, later than that.
DUE_LEFT = """SELECT EXISTS (SELECT FROM batchq_jobs WHERE queue = %s AND state = 'queued'
                             AND run_at <= clock_timestamp())"""
# The outcomes, each in the batch's transaction.
DONE = """UPDATE batchq_jobs SET state = 'done', done_at = clock_timestamp(), done_by = %s, claimed_by = NULL
          WHERE id = %s"""
FAILED = """UPDATE batchq_jobs SET state = 'queued', last_error = %s, claimed_by = NULL,
                                  run_at = clock_timestamp() + %s * interval '1 second' WHERE id = %s"""
DEAD = """UPDATE batchq_jobs SET state = 'dead', last_error = %s, claimed_by = NULL WHERE id = %s"""
RELEASE = """UPDATE batchq_jobs SET state = 'queued', claimed_by = NULL WHERE id = ANY(%s::bigint[])"""


def credential(name):
    """This run's systemd credential name (the role's credentials), or None."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    try:
        with open(os.path.join(directory, name), encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def connection_options():
    """What connects the batch, beside libpq's environment: CONNECTION, its name, the credential's password."""
    options = dict(CONNECTION, application_name=batch_name()[:63])
    password = credential("pgpassword")
    if password is not None:
        options["password"] = password
    return options


def batch_name():
    """host/consumer@instance/invocation#batch: who applied a result, in the table and in the records."""
    consumer = os.environ.get("BATCHQ_CONSUMER", "pgqueue")
    if os.environ.get("BATCHQ_INSTANCE"):
        consumer += "@" + os.environ["BATCHQ_INSTANCE"]
    return "%s/%s/%s#%s" % (socket.gethostname(), consumer, os.environ.get("INVOCATION_ID", "-")[:12],
                            os.environ.get("BATCHQ_BATCH", "1"))


def record(event, limit, **fields):
    """Append one line to this consumer's own records (one write, so instances do not interleave).

    Once the file holds limit bytes it becomes batches.jsonl.1 (replacing the
    one before) and the next line starts a new file: the records take at most
    about twice limit, and always hold the last limit bytes. The instances of a
    consumer share the file: each appends and renames under an exclusive lock
    of the file, and appends again to the new one if another renamed it first."""
    directory = os.environ.get("STATE_DIRECTORY")
    if not directory:
        return
    path = os.path.join(directory.split(":")[0], RECORDS)
    line = (json.dumps(dict(fields, event=event, batch=batch_name(), time=time.time())) + "\n").encode()
    try:
        batchq_queue.append_record(path, line, limit, 0o666)
    except OSError as exc:  # a full disk must not fail the batch: its jobs' attempts would be used up in vain
        print("batch records not written: %s" % exc, file=sys.stderr)


def startup_settings(options):
    """The names of the settings a libpq options string sets ("-c name=value",
    "-cname=value" or "--name=value", spaces escaped with a backslash), as the
    server reads them."""
    words, word, escaped = [], "", False
    for char in (options or "") + " ":
        if escaped:
            word, escaped = word + char, False
        elif char == "\\":
            escaped = True
        elif char.isspace():
            if word:
                words.append(word)
            word = ""
        else:
            word += char
    names = set()
    for index, word in enumerate(words):
        if word == "-c" and index + 1 < len(words):
            setting = words[index + 1]
        elif word.startswith("-c") and word != "-c":
            setting = word[2:]
        elif word.startswith("--"):
            setting = word[2:]
        else:
            continue
        if "=" in setting:
            names.add(setting.split("=", 1)[0].strip().lower().replace("-", "_"))
    return names


def configure_session(conn):
    """SESSION's settings, for the whole session: a rollback does not undo them
    (a pooler's reset does, when the batch's connection ends). One statement
    that reads no catalog: it runs once per batch."""
    given = startup_settings(conn.info.options)
    settings = [(name, value) for name, value in SESSION if name not in given]
    if not settings:
        return
    conn.autocommit = True
    with conn.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(settings)),
                       [value for setting in settings for value in setting])
    conn.autocommit = False


def apply_result(cursor, job, result, me):
    """The database writes of a done job's result, in the batch's transaction; replace them with yours.
    result is what process(job) returned: a text as it is, anything else as its JSON text."""
    value = json.loads(result) if result.startswith('"') else result
    cursor.execute("INSERT INTO batchq_results (job_id, result, applied_by) VALUES (%s, %s, %s)",
                   (job.id, value, me))


def add_options(parser):
    parser.add_argument("--queue", default="default")
    parser.add_argument("--records-bytes", type=int, default=1 << 20,
                        help="size of batches.jsonl at which it becomes batches.jsonl.1")
    parser.add_argument("--backoff-base", type=float,
                        help="the old spelling: the least wait after a first failure; --backoff-min twice that")
    parser.add_argument("--loop", action="store_true",
                        help="a long-lived worker instead: batch after batch on one connection while due jobs wait "
                             "(the comparison of benchmarks/fleet.sh)")
    # A job waits 1 to 2 s after its first failure, and 3 to 6 h at the end: 25 attempts outlast a day of outage.
    parser.set_defaults(max_attempts=25, backoff_min=2.0, backoff_max=6 * 3600.0, job_timeout=20.0)


def check(args):
    """What is wrong with the PostgreSQL options; None when nothing is. --backoff-base becomes --backoff-min."""
    if args.queue == "":
        return "--queue: must be a name, got ''"
    if args.records_bytes < 1024:
        return "--records-bytes: must be at least 1024, got %s" % args.records_bytes
    if args.backoff_base is not None:
        if not (math.isfinite(args.backoff_base) and 0 < args.backoff_base <= args.backoff_max):
            return "--backoff-base: must be more than 0 seconds, at most --backoff-max, got %s" % args.backoff_base
        # Its old meaning: a job waits at least --backoff-base after a first failure. The library's wait
        # is the upper half of --backoff-min's span.
        args.backoff_min = min(2 * args.backoff_base, args.backoff_max)
    return None


class PgBackend(batchq_queue.Backend):
    """The job table of schema.sql; connect() makes the batch's connection."""

    def __init__(self, args, connect=None):
        self.args = args
        self.connect = connect or (lambda: psycopg.connect(os.environ.get("BATCHQ_PG_DSN", ""),
                                                           **connection_options()))
        self.conn = None
        self.me = batch_name()
        self.counts = {}
        self.spoke = 0.0
        self.broken = None
        self.due_left = False

    def _gone(self, what, exc):
        """A statement outside a savepoint failed: the batch's transaction is lost, whatever comes next."""
        self.broken = self.broken or "%s: %s" % (what, str(exc).strip())
        return QueueError(self.broken)

    def claim(self, limit):
        self.counts = {"claimed": 0, "done": 0, "failed": 0, "dead": 0, "left": 0}
        self.broken = None
        try:
            if self.conn is None:
                self.conn = self.connect()
                configure_session(self.conn)
            with self.conn.cursor() as cursor:
                values = {"queue": self.args.queue, "max": self.args.max_attempts, "grace": CLAIM_GRACE,
                          "limit": limit, "me": self.me}
                cursor.execute(BURY_ABANDONED, values)
                cursor.execute(CLAIM, values)
                claimed = sorted(cursor.fetchall())
                # Recorded before the commit: every attempt counted has a record of the batch that claimed it.
                record("claim", self.args.records_bytes, ids=[row[0] for row in claimed])
                self.conn.commit()  # the attempts are counted, whatever becomes of the batch
                cursor.execute(LOCK, ([row[0] for row in claimed], self.me))
                held = {row[0] for row in cursor.fetchall()}
        except psycopg.Error as exc:
            record("end", self.args.records_bytes, outcome="error", error=str(exc).strip())
            raise QueueError(str(exc).strip()) from exc
        self.spoke = time.monotonic()
        # None lost to another claim, unless this one stalled past CLAIM_GRACE.
        jobs = [batchq_queue.Job(job_id, payload, attempts) for job_id, payload, attempts in claimed
                if job_id in held]
        self.counts["claimed"] = len(jobs)
        return jobs

    def keep_alive(self, jobs):
        # Not idle in the transaction while jobs work: the server's timeout ends a hung batch, not a long one.
        if jobs and not self.broken and time.monotonic() - self.spoke >= batchq_queue.HEARTBEAT:
            self._execute("keep_alive", [("SELECT 1", ())])

    def _execute(self, what, statements):
        try:
            with self.conn.cursor() as cursor:
                for query, values in statements:
                    cursor.execute(query, values)
        except psycopg.Error as exc:
            raise self._gone(what, exc) from exc
        self.spoke = time.monotonic()

    def _job_writes(self, writes):
        """writes(cursor) under a savepoint of its own; the refusal's text when the database, or the
        driver, refused them: then nothing of them is applied and the batch's transaction goes on."""
        self._execute("savepoint", [("SAVEPOINT job", ())])
        try:
            with self.conn.cursor() as cursor:
                writes(cursor)
        except (psycopg.Error, ValueError) as exc:  # ValueError: a text the driver will not send (NUL, surrogate)
            self._execute("rollback to savepoint", [("ROLLBACK TO SAVEPOINT job", ())])
            return clean_text(str(exc).strip())
        self._execute("release savepoint", [("RELEASE SAVEPOINT job", ())])
        return None

    def done(self, job, result):
        def writes(cursor):
            apply_result(cursor, job, result, self.me)
            cursor.execute(DONE, (self.me, job.id))
        refusal = self._job_writes(writes)
        if refusal:
            raise batchq_queue.Refused(refusal)
        self.counts["done"] += 1

    def failed(self, job, error, delay):
        self._outcome(FAILED, (error, delay, job.id))

    def dead(self, job, error):
        self._outcome(DEAD, (error, job.id))
        self.counts["dead"] += 1

    def _outcome(self, query, values):
        refusal = self._job_writes(lambda cursor: cursor.execute(query, values))
        if refusal:
            raise QueueError("the job's outcome was refused: %s" % refusal)
        self.counts["failed"] += 1

    def release(self, jobs):
        self._execute("release", [(RELEASE, ([job.id for job in jobs],))])
        self.counts["left"] = len(jobs)

    def finish(self):
        outcome = "terminated" if batchq_queue.TERM["asked"] else "committed"
        try:
            if self.broken:
                raise QueueError(self.broken)
            with self.conn.cursor() as cursor:
                cursor.execute(DUE_LEFT, (self.args.queue,))
                self.due_left = cursor.fetchone()[0]
            self.conn.commit()
        except (psycopg.Error, QueueError) as exc:
            with contextlib.suppress(psycopg.Error):
                self.conn.rollback()
            # The batch's transaction did not commit: none of its results were applied.
            record("end", self.args.records_bytes, outcome="error", error=str(exc).strip())
            raise QueueError("the batch rolled back, nothing of it applied: %s" % str(exc).strip()) from exc
        record("end", self.args.records_bytes, outcome=outcome, **self.counts)
        print("%s: %d jobs claimed, %d done, %d failed (%d now dead), %d left to the queue" % (
            outcome, self.counts["claimed"], self.counts["done"], self.counts["failed"], self.counts["dead"],
            self.counts["left"]), flush=True)

    def more(self):
        return self.due_left

    def close(self):
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()


def main(argv, make_process, description=None):
    """The library's main() with PostgreSQL's options, and --loop. make_process(args) returns process(job)."""
    parser = argparse.ArgumentParser(description=description)
    batchq_queue.add_common_options(parser)
    add_options(parser)
    args = parser.parse_args(argv)
    problem = batchq_queue.option_problem(args) or check(args)
    if problem:
        parser.exit(2, "%s: error: %s\n" % (parser.prog, problem))  # before any connection or claim
    signal.signal(signal.SIGTERM, batchq_queue.on_sigterm)
    backend = PgBackend(args)
    process = make_process(args)
    try:
        code = batchq_queue.run_batch(backend, process, args)
        while args.loop and code == args.backlog_exit_code and not batchq_queue.TERM["asked"]:
            code = batchq_queue.run_batch(backend, process, args)
    finally:
        backend.close()
    return code
