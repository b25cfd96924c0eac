# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A PostgreSQL job table (schema.sql) as a batchq_queue Backend.
Needs psycopg 3 or psycopg2 (Debian 11 packages only psycopg2).

Connects with libpq's usual environment (PGHOST, PGDATABASE, PGUSER, ...)
or BATCHQ_PG_DSN. The password is the run's systemd credential pgpassword
(the role's credentials: a file in $CREDENTIALS_DIRECTORY, never in the
environment), or else PGPASSWORD.

A batch works on one connection, in short transactions of their own:
1. The claim commits on its own. The jobs become 'running', claimed by this
   batch, with one more attempt counted. The count is durable before any
   work begins. So a batch that dies (SIGSEGV, out of memory, its timeout,
   its host lost) has used that attempt like a job that raises. A job that
   kills every batch ends 'dead' after --max-attempts.
2. Each job's outcome commits apart from the batch, soon after the job
   ends, in one statement: its 'done' mark and its result together (DONE),
   or 'queued' again after a backoff, or 'dead'. The session is in
   autocommit, so that statement is a transaction of its own: one round
   trip, no BEGIN nor COMMIT. A done job's outcome waits at most
   --commit-delay (0.2 s) to commit in the same statement as those of the
   jobs that end meanwhile: small jobs then cost a statement every 0.2 s,
   not one each. A batch killed keeps every job whose outcome committed,
   and charges it nothing more. A job that ended less than --commit-delay
   before the kill runs again, as the job at work does. With
   --commit-delay 0, each outcome commits as its job ends. No transaction
   is open while a job works, so a long batch holds back no VACUUM.
A result the database refuses (a constraint, a NUL byte) fails its own
statement, and nothing of it is applied: that job fails, and the batch goes
on. When the outcomes of several jobs wait, and the database refuses their
statement, each is written again alone: only the refused one fails.

How a batch holds its jobs while they work: by its session. Before its
claim, the batch takes a session-level advisory lock, its claim lock: the
oid of the job table, and a number drawn at random, which its jobs keep in
claim_lock.
The lock goes with the session: when the batch's process dies, when its host
is lost and the server drops the connection, when the server ends the
session. A 'running' job whose lock nobody holds has lost its batch. The
next claim takes it back at once, or makes it 'dead' when it has used its
last attempt. Why not a lease (a claimed_until that the batch extends every
second)? It writes every held job each second, and a dead batch's jobs wait
until the lease runs out. The lock writes nothing, and frees a dead batch's
jobs as soon as the server knows. A pooler must keep a batch on one server
session (PgBouncer's session mode, as pooler.yml sets): its reset after the
batch (DISCARD ALL) releases the lock.
A 'running' job without claim_lock was claimed by a consumer of before this
lock. Its batch held it by a row lock in a transaction. It is taken back
when no transaction locks it, CLAIM_GRACE after its claim at the earliest.
Upgrade every consumer at once (or pause them): a consumer of before takes
the jobs of a new batch back CLAIM_GRACE after their claim, though they work.

A lost session (a terminated backend, a server restart, a cut network) ends
the batch. From then on every call raises QueueError: no other job starts,
and the job at work is not done, as its outcome cannot commit. A job counts
as done once its commit returned, never before.

SIGTERM: no claim starts after it. A claim it arrives in is cancelled and
rolled back: nothing is claimed, no attempt counted. Jobs claimed but not
started (SIGTERM, --max-seconds) go back 'queued'. They keep their attempt,
as the contract says.

Done jobs are kept --keep-done-days (7), then deleted, with their results,
by the batches: each deletes at most PRUNE_ROWS of them (or twice --limit,
if more) as it ends. schema.sql shows the statement to prune by hand. Dead
jobs are kept, for a person to look at.

Its own records (batches.jsonl in $STATE_DIRECTORY, the older ones in
batches.jsonl.1, at most about twice --records-bytes in all) say which jobs
each batch claimed and how it ended.
"""

import argparse
import contextlib
import json
import math
import os
import random
import select
import signal
import socket
import sys
import time

try:
    import psycopg
    WAIT_IN_PYTHON = None
except ImportError:  # Debian 11 ships psycopg2 only; the calls below are common to both
    import psycopg2 as psycopg
    import psycopg2.extras
    # psycopg2 waits for the server in C, where no signal handler runs. With this
    # callback it waits in Python, and a SIGTERM can cancel the claim at once.
    # psycopg 3 waits so on its own.
    WAIT_IN_PYTHON = psycopg2.extras.wait_select

import batchq_queue
from batchq_queue import QueueError, clean_text

# How quickly a dead peer's connection, and so its claim lock, is given up on.
CONNECTION = {
    "connect_timeout": 10,
    # the client notices a silent server, and the server (postgresql.conf
    # tcp_keepalives_*) a silent client, in seconds rather than hours
    "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
    # unacknowledged data (a COMMIT sent into a cut cable) gives up after 10 s
    "tcp_user_timeout": 10000,
}
# A claim never waits long for a lock; no statement runs away. A batch that
# stops talking (its process hung: its kernel still answers keepalives) is
# ended by the server, which releases its claim lock. The batch speaks at least
# once a second while its jobs work (keep_alive), so these bound the batch's own
# pauses, not its work. idle_session_timeout needs PostgreSQL 14: on 13, a hung
# batch keeps its jobs until its timeout kills it. Set once connected rather
# than as startup options, which a pooler may refuse (PgBouncer before 1.20
# does); what the startup options set (PGOPTIONS, or options= in the DSN) stays
# as they set it.
SESSION = (("lock_timeout", "5s"), ("statement_timeout", "30s"), ("idle_in_transaction_session_timeout", "60s"),
           ("idle_session_timeout", "60s"))
# A job that a consumer of before claim_lock claimed is taken back only this
# long after its claim: that batch locked it one round trip after the claim.
CLAIM_GRACE = 10
# The most done jobs a batch deletes (or twice --limit, if more): more than it
# can make done itself, so that the table shrinks back to --keep-done-days.
PRUNE_ROWS = 1000
RECORDS = "batches.jsonl"
# The claim lock's number: drawn from the system's randomness, so that
# batches forked from one runner (preload) draw different numbers.
NUMBERS = random.SystemRandom()

# A session lock of this batch's own; another batch that drew the same number holds it already.
TAKE_LOCK = "SELECT pg_try_advisory_lock('batchq_jobs'::regclass::oid::int, %s::int)"
# A running job whose batch is gone: nobody holds its claim lock (trying it
# holds it until the claim commits, and no new batch draws it meanwhile). Or,
# claimed by a consumer of before claim_lock, it is CLAIM_GRACE old and no
# row lock holds it (SKIP LOCKED).
GONE = """CASE WHEN claim_lock IS NULL THEN claimed_at < now() - %(grace)s * interval '1 second'
               ELSE pg_try_advisory_xact_lock('batchq_jobs'::regclass::oid::int, claim_lock) END"""
# The claim, one transaction: jobs whose batch is gone and that have no attempt
# left are dead; then the batch takes jobs whose batch is gone, and due ones.
BURY_ABANDONED = """
    UPDATE batchq_jobs
    SET state = 'dead', claimed_by = NULL, claim_lock = NULL,
        last_error = 'its batch ended without finishing it, attempt ' || attempts || ' of ' || %(max)s
    WHERE id IN (SELECT id FROM batchq_jobs
                 WHERE queue = %(queue)s AND state = 'running' AND attempts >= %(max)s AND """ + GONE + """
                 FOR NO KEY UPDATE SKIP LOCKED)"""
# The payload as text: the job decodes it in its own process. A payload Python
# cannot decode (a 5000-digit number, arrays nested 5000 deep) fails that job
# alone, after its attempt is counted.
CLAIM = """
    WITH abandoned AS (
        SELECT id FROM batchq_jobs
        WHERE queue = %(queue)s AND state = 'running' AND """ + GONE + """
        ORDER BY claimed_at LIMIT %(limit)s FOR NO KEY UPDATE SKIP LOCKED
    ), due AS (
        SELECT id FROM batchq_jobs
        WHERE queue = %(queue)s AND state = 'queued' AND run_at <= now()
        ORDER BY run_at, id LIMIT %(limit)s - (SELECT count(*) FROM abandoned) FOR NO KEY UPDATE SKIP LOCKED
    )
    UPDATE batchq_jobs SET state = 'running', attempts = attempts + 1, claimed_by = %(me)s,
                           claim_lock = %(lock)s, claimed_at = now()
    WHERE id IN (SELECT id FROM abandoned UNION ALL SELECT id FROM due)
    RETURNING id, payload::text, attempts"""
# The outcomes: each one statement, a transaction of its own (autocommit), and only of jobs
# that this batch still holds. One statement, not BEGIN, the writes and COMMIT: each statement
# is a round trip, and costs the client and the server CPU (benchmarks/queues.py; the
# performance guide, "Small jobs in the reference consumers").
OURS = "id = %(id)s AND state = 'running' AND claimed_by = %(me)s AND claim_lock = %(lock)s"
# The writes of a done job's result; replace them with yours. Each is a data-modifying WITH
# query that reads "done": a row for each job marked done, its id and its result (what
# process(job) returned: a text as it is, anything else as its JSON text). PostgreSQL runs
# each of them to its end, though the statement's last SELECT reads none of them.
RESULT_WRITES = """
    result AS (INSERT INTO batchq_results (job_id, result, applied_by) SELECT id, result, %(me)s FROM done)"""
# Done jobs, one or more (--commit-delay): each one's 'done' mark and its result's writes, all or
# none. Its row counts the jobs marked: fewer than given when a job is no longer this batch's.
DONE = """
    WITH outcome AS (
        SELECT * FROM unnest(%(ids)s::bigint[], %(results)s::text[]) AS outcome (id, result)
    ), done AS (
        UPDATE batchq_jobs SET state = 'done', done_at = now(), done_by = %(me)s, claimed_by = NULL, claim_lock = NULL
        FROM outcome
        WHERE batchq_jobs.id = outcome.id AND state = 'running' AND claimed_by = %(me)s AND claim_lock = %(lock)s
        RETURNING batchq_jobs.id, outcome.result
    ),""" + RESULT_WRITES + """
    SELECT count(*) FROM done"""
FAILED = """UPDATE batchq_jobs SET state = 'queued', last_error = %(error)s, claimed_by = NULL, claim_lock = NULL,
                                   run_at = now() + %(delay)s * interval '1 second' WHERE """ + OURS
DEAD = """UPDATE batchq_jobs SET state = 'dead', last_error = %(error)s, claimed_by = NULL, claim_lock = NULL
          WHERE """ + OURS
RELEASE = """UPDATE batchq_jobs SET state = 'queued', claimed_by = NULL, claim_lock = NULL
             WHERE id = ANY(%(ids)s::bigint[]) AND state = 'running'
               AND claimed_by = %(me)s AND claim_lock = %(lock)s"""
# The batch's end: its claim lock goes (a --loop batch keeps the session), and is a due job left?
FINISH = """SELECT pg_advisory_unlock('batchq_jobs'::regclass::oid::int, %(lock)s::int),
                   EXISTS (SELECT FROM batchq_jobs WHERE queue = %(queue)s AND state = 'queued' AND run_at <= now())"""
# Done jobs older than --keep-done-days, and their results, a chunk at a time (schema.sql: by hand).
PRUNE = """
    WITH old AS (
        SELECT id FROM batchq_jobs
        WHERE queue = %(queue)s AND state = 'done' AND done_at < now() - %(days)s * interval '1 day'
        LIMIT %(rows)s FOR UPDATE SKIP LOCKED
    ), results AS (
        DELETE FROM batchq_results WHERE job_id IN (SELECT id FROM old)
    )
    DELETE FROM batchq_jobs WHERE id IN (SELECT id FROM old)"""


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
    """SESSION's settings, for the whole session (a pooler's reset undoes them when the
    batch's connection ends), and autocommit: each statement is a transaction of its own,
    and the claim writes its transaction out (BEGIN ... COMMIT). The batch is in no
    transaction between them. One statement that reads no catalog: it runs once per batch."""
    given = startup_settings(conn.info.options)
    settings = [(name, value) for name, value in SESSION if name not in given
                and (name != "idle_session_timeout" or conn.info.server_version >= 140000)]
    conn.autocommit = True
    if settings:
        with conn.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(settings)),
                           [value for setting in settings for value in setting])


def add_options(parser):
    parser.add_argument("--queue", default="default")
    parser.add_argument("--records-bytes", type=int, default=1 << 20,
                        help="size of batches.jsonl at which it becomes batches.jsonl.1")
    parser.add_argument("--keep-done-days", type=float, default=7.0,
                        help="days a done job is kept before a batch deletes it, with its result (0: for ever)")
    parser.add_argument("--backoff-base", type=float,
                        help="the old spelling: the least wait after a first failure; --backoff-min twice that")
    parser.add_argument("--commit-delay", type=float, default=0.2,
                        help="seconds a done job's outcome may wait, to commit with those of the jobs that end "
                             "meanwhile (0: each at once)")
    parser.add_argument("--loop", action="store_true",
                        help="a long-lived worker instead: batch after batch on one connection while due jobs wait "
                             "(the comparison of benchmarks/fleet.sh)")
    # A job waits 1 to 2 s after its first failure, and 3 to 6 h at the end: 25 attempts outlast a day of outage.
    parser.set_defaults(max_attempts=25, backoff_min=2.0, backoff_max=6 * 3600.0, job_timeout=20.0)


def check(args):
    """What is wrong with the PostgreSQL options; None when nothing is. --backoff-base becomes --backoff-min."""
    if args.queue == "":
        return "--queue: must be a name, got ''"
    if not (math.isfinite(args.commit_delay) and 0 <= args.commit_delay <= 1):
        return "--commit-delay: must be from 0 (each outcome at once) to 1 second, got %s" % args.commit_delay
    if args.records_bytes < 1024:
        return "--records-bytes: must be at least 1024, got %s" % args.records_bytes
    if not (math.isfinite(args.keep_done_days) and 0 <= args.keep_done_days <= 36500):
        return "--keep-done-days: must be from 0 (for ever) to 36500 days, got %s" % args.keep_done_days
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
        # Done jobs whose outcome waits to commit with others': (job, result, since when)
        self.hold_seconds = args.commit_delay
        self.held = []
        # The cursor of the jobs' outcomes, one a session: a cursor a job cost psycopg 3 (pure
        # Python on Debian) about 50 us of the batch's 400 us of CPU a job.
        self.cursor = None
        self.me = batch_name()
        self.lock = None  # this batch's claim lock: the number in claim_lock of the jobs it holds
        self.counts = {}
        self.spoke = 0.0
        self.broken = None  # what lost the session, once it is lost
        self.claiming = False  # the claim's statements are at the server: a SIGTERM cancels them
        self.due_left = False

    def on_sigterm(self, signum, frame):
        """The library's handler; and a claim at the server is cancelled. It then rolls back: nothing is claimed."""
        batchq_queue.on_sigterm(signum, frame)
        if self.claiming:
            with contextlib.suppress(psycopg.Error):
                self.conn.cancel()

    def claim(self, limit):
        # unknown: the outcomes whose statement got no answer, as the session was lost
        self.counts = {"claimed": 0, "done": 0, "failed": 0, "dead": 0, "left": 0, "unknown": 0}
        self.broken = None
        if batchq_queue.TERM["asked"]:
            return []  # stopped before the claim: nothing to roll back
        try:
            if self.conn is None:
                self.conn = self.connect()
                configure_session(self.conn)
                self.cursor = self.conn.cursor()
            claimed = self._claim(limit)
        except psycopg.Error as exc:
            self._disconnect()  # the server rolls back what the claim began, and drops its lock
            if batchq_queue.TERM["asked"]:
                return []  # the SIGTERM cancelled the claim
            record("end", self.args.records_bytes, outcome="error", error=str(exc).strip())
            raise QueueError(str(exc).strip()) from exc
        if claimed is None:
            self._disconnect()
            return []
        self.spoke = time.monotonic()
        jobs = [batchq_queue.Job(job_id, payload, attempts) for job_id, payload, attempts in claimed]
        self.counts["claimed"] = len(jobs)
        return jobs

    def _claim(self, limit):
        """The claim's transaction: the jobs claimed and committed, or None when a SIGTERM came
        before its commit (then the caller drops the connection, and with it the transaction)."""
        with self.conn.cursor() as cursor:
            self.lock = None
            while self.lock is None:
                number = NUMBERS.randrange(1, 1 << 31)
                cursor.execute(TAKE_LOCK, (number,))
                self.lock = number if cursor.fetchone()[0] else None
            values = {"queue": self.args.queue, "max": self.args.max_attempts, "grace": CLAIM_GRACE,
                      "limit": limit, "me": self.me, "lock": self.lock}
            with self._cancellable():
                cursor.execute("BEGIN")
                cursor.execute(BURY_ABANDONED, values)
                cursor.execute(CLAIM, values)
                claimed = sorted(cursor.fetchall())
            if batchq_queue.TERM["asked"]:
                return None
            # Recorded before the commit: every attempt counted has a record of the batch that claimed it.
            record("claim", self.args.records_bytes, ids=[row[0] for row in claimed])
            cursor.execute("COMMIT")  # the attempts are counted, whatever becomes of the batch
        return claimed

    @contextlib.contextmanager
    def _cancellable(self):
        """While the claim's statements are at the server, a SIGTERM's handler runs and cancels them."""
        self.claiming = True
        if WAIT_IN_PYTHON:
            psycopg.extensions.set_wait_callback(WAIT_IN_PYTHON)
        try:
            yield
        finally:
            self.claiming = False
            if WAIT_IN_PYTHON:  # only the claim: a connection made while it is set ignores connect_timeout
                psycopg.extensions.set_wait_callback(None)

    def _disconnect(self):
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        self.conn = self.cursor = None

    def _gone(self, what, exc):
        """A statement failed, and the session is lost or of no more use (a job's outcome refused
        is not this). It is closed (its claim lock with it), every later call fails, and no job starts."""
        self.broken = self.broken or "%s: %s" % (what, clean_text(str(exc).strip()))
        self._disconnect()
        return QueueError(self.broken)

    def _alive(self):
        """QueueError once the session is lost. A server that ends it (a terminated backend,
        a restart) says so on the socket: only then does the check cost a round trip."""
        if self.broken:
            raise QueueError(self.broken)
        poller = select.poll()
        try:
            poller.register(self.conn.fileno(), select.POLLIN)
        except psycopg.Error as exc:  # the driver knows it closed
            raise self._gone("the session", exc) from exc
        if poller.poll(0):
            self._execute("the session", "SELECT 1")

    def _execute(self, what, query, values=None):
        """One statement on its own; its first row, if it returns rows. QueueError when it fails (_gone)."""
        if self.broken:
            raise QueueError(self.broken)
        try:
            with self.conn.cursor() as cursor:
                cursor.execute(query, values)
                row = cursor.fetchone() if cursor.description else None
        except psycopg.Error as exc:
            raise self._gone(what, exc) from exc
        self.spoke = time.monotonic()
        return row

    def keep_alive(self, jobs):
        # Once a second while jobs work: a lost session ends the batch within a second, and
        # the server's idle_session_timeout ends a hung batch only.
        if jobs and not self.broken and time.monotonic() - self.spoke >= batchq_queue.HEARTBEAT:
            self._execute("the heartbeat", "SELECT 1")

    def start(self, job):
        self._alive()  # no job starts once the session is lost: its outcome could not be written

    def _write(self, jobs, query, values):
        """The outcome of jobs (a list): query, one statement that commits on its own (autocommit).
        None once it committed. The refusal's text when the database (or the driver: a NUL, a lone
        surrogate) refused it: nothing of it is applied then, and the session goes on. QueueError
        when the session is lost (nothing is known applied), or when a job is no longer this batch's."""
        if self.broken:
            raise QueueError(self.broken)
        shown_ids = ", ".join(str(job.id) for job in jobs)
        try:
            self.cursor.execute(query, values)
            marked = self.cursor.fetchone()[0] if self.cursor.description else self.cursor.rowcount
        except (psycopg.Error, ValueError) as exc:
            # A refusal leaves the session as it was; a lost session fails this statement too.
            try:
                with self.conn.cursor() as cursor:
                    cursor.execute("SELECT 1")
            except psycopg.Error:
                self.counts["unknown"] = len(jobs)  # the server may have committed them, its answer lost
                raise self._gone("the outcome of job %s" % shown_ids, exc) from exc
            return clean_text(str(exc).strip())
        self.spoke = time.monotonic()
        if marked != len(jobs):  # set 'dead', or taken back, by another hand (a consumer of before claim_lock?)
            raise QueueError("%d of the jobs %s are no longer this batch's: their outcomes are not written"
                             % (len(jobs) - marked, shown_ids))
        return None

    def _ours(self, job, **values):
        return dict(values, id=job.id, me=self.me, lock=self.lock)

    def done(self, job, result):
        value = json.loads(result) if result.startswith('"') else result  # a text as it is
        if self.hold_seconds:
            if self.broken:
                raise QueueError(self.broken)
            self.held.append((job, value, time.monotonic()))
            return
        refusal = self._write_done([(job, value)])
        if refusal:
            raise batchq_queue.Refused(refusal)

    def flush(self, everything):
        """The held outcomes, in one statement, once the oldest waited --commit-delay. If the
        database refuses it (one result breaks a constraint), each is written alone: only the
        refused ones fail. A lost session raises QueueError: none of them is known written."""
        if not self.held or not (everything or time.monotonic() - self.held[0][2] >= self.hold_seconds):
            return []
        held, self.held = self.held, []
        if self._write_done([(job, value) for job, value, _since in held]) is None:
            return [(job, None) for job, _value, _since in held]
        return [(job, self._write_done([(job, value)])) for job, value, _since in held]

    def _write_done(self, outcomes):
        """Done jobs' outcomes, [(job, result)], in one statement (_write)."""
        jobs = [job for job, _value in outcomes]
        values = {"ids": [job.id for job in jobs], "results": [value for _job, value in outcomes],
                  "me": self.me, "lock": self.lock}
        refusal = self._write(jobs, DONE, values)
        if refusal is None:
            self.counts["done"] += len(jobs)
        return refusal

    def failed(self, job, error, delay):
        self._outcome(job, FAILED, self._ours(job, error=error, delay=delay))

    def dead(self, job, error):
        self._outcome(job, DEAD, self._ours(job, error=error))
        self.counts["dead"] += 1

    def _outcome(self, job, query, values):
        refusal = self._write([job], query, values)
        if refusal:
            raise QueueError("the job's outcome was refused: %s" % refusal)
        self.counts["failed"] += 1

    def release(self, jobs):
        self._execute("the release", RELEASE, {"ids": [job.id for job in jobs], "me": self.me, "lock": self.lock})
        self.counts["left"] = len(jobs)

    def finish(self):
        outcome = "terminated" if batchq_queue.TERM["asked"] else "committed"
        if self.broken:
            self._report("error", error=self.broken)
            raise QueueError("the batch lost its session; the jobs it did stay done, the others go back to the "
                             "queue: %s" % self.broken)
        if self.conn is None:  # a SIGTERM ended the claim: no session, nothing claimed
            self.due_left = False
            self._report(outcome)
            return
        if not batchq_queue.TERM["asked"] and self.args.keep_done_days:
            self._prune()
        try:
            values = {"lock": self.lock, "queue": self.args.queue}
            _unlocked, self.due_left = self._execute("the batch's end", FINISH, values)
        except QueueError:
            self._report("error", error=self.broken)
            raise
        self._report(outcome)

    def _prune(self):
        """Done jobs past --keep-done-days go, with their results, a chunk a batch. A refusal (a table
        of yours that refers to a job) is said, and the batch goes on: its work is committed already."""
        values = {"queue": self.args.queue, "days": self.args.keep_done_days,
                  "rows": max(PRUNE_ROWS, 2 * self.args.limit)}
        try:
            with self.conn.cursor() as cursor:
                cursor.execute(PRUNE, values)
                self.counts["pruned"] = cursor.rowcount
        except psycopg.Error as exc:
            print("batchq-pgqueue: done jobs not pruned: %s" % clean_text(str(exc).strip()), file=sys.stderr)

    def _report(self, outcome, **fields):
        """The batch's end, in its records and on stdout: the outcomes committed, no others."""
        record("end", self.args.records_bytes, outcome=outcome, **dict(self.counts, **fields))
        print("%s: %d jobs claimed, %d done, %d failed (%d now dead), %d left to the queue" % (
            outcome, self.counts["claimed"], self.counts["done"], self.counts["failed"], self.counts["dead"],
            self.counts["left"]), flush=True)

    def more(self):
        return self.due_left

    def close(self):
        self._disconnect()


def main(argv, make_process, description=None):
    """The library's main() with PostgreSQL's options, and --loop. make_process(args) returns process(job)."""
    parser = argparse.ArgumentParser(description=description)
    batchq_queue.add_common_options(parser)
    add_options(parser)
    args = parser.parse_args(argv)
    problem = batchq_queue.option_problem(args) or check(args)
    if problem:
        parser.exit(2, "%s: error: %s\n" % (parser.prog, problem))  # before any connection or claim
    backend = PgBackend(args)
    signal.signal(signal.SIGTERM, backend.on_sigterm)
    process = make_process(args)
    try:
        code = batchq_queue.run_batch(backend, process, args)
        while args.loop and code == args.backlog_exit_code and not batchq_queue.TERM["asked"]:
            code = batchq_queue.run_batch(backend, process, args)
    finally:
        backend.close()
    return code
