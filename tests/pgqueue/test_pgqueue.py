"""examples/postgresql_queue against a real PostgreSQL, with psycopg2 and psycopg 3.

Each test has a queue and a records folder (`queue`, /tmp/<queue> in the
client) of its own; everything is judged from the database and the
consumer's own records.
"""

import hashlib
import json
import re
import shlex
import subprocess
import tempfile
import time
import uuid

import pytest

import drain_runner
from conftest import DATABASE, EXAMPLE, LIBRARY_DIR, NETWORK, ROOT, docker, sql, states
from waiting import wait_for

# The server's idle timeouts for the batch of the test below, set as a consumer's
# environment would (PGOPTIONS comes after the consumer's own 60 s, so it wins):
# the batch outlasts them by far, and speaks while it works.
IDLE_S = 3
# batchq-pgqueue's CLAIM_GRACE: a running job that a consumer of before claim_lock claimed, and that no
# transaction locks, is taken back this long after its claim.
CLAIM_GRACE_S = 10
# batchq-pgqueue's PRUNE_ROWS: the most done jobs a batch deletes (or twice --limit).
PRUNE_ROWS = 1000


def enqueue(client, queue, count, failing=0):
    code, output = client.run("batchq-pgqueue-enqueue", str(count), "--queue", queue, "--failing", str(failing))
    assert code == 0, output
    assert states(queue) == {"queued": count}


def jobs(queue):
    """(n, state, attempts) of each job of queue, by n."""
    rows = sql("SELECT payload->>'n', state, attempts FROM batchq_jobs WHERE queue = '%s' ORDER BY id" % queue)
    return [(int(n) if n else None, state, int(attempts))
            for n, state, attempts in (line.split("|") for line in rows.splitlines())]


def job_id(queue, n):
    return sql("SELECT id FROM batchq_jobs WHERE queue = '%s' AND payload->>'n' = '%d'" % (queue, n))


def results(queue):
    """The number of results applied for the jobs of queue."""
    return int(sql("SELECT count(*) FROM batchq_results r JOIN batchq_jobs j ON j.id = r.job_id "
                   "WHERE j.queue = '%s'" % queue))


def claimed(client, state):
    return [r for r in client.records(state) if r["event"] == "claim" and r["ids"]]


def test_enqueue_and_stats(client, queue):
    code, output = client.run("batchq-pgqueue-enqueue", "7", "--queue", queue, "--failing", "2")
    assert code == 0, output
    assert output.strip() == "enqueued 7 jobs on queue %s (2 failing, 0 crashing, 0 raising)" % queue
    assert sql("SELECT count(*) FILTER (WHERE (payload->>'fail')::boolean), count(*) FROM batchq_jobs "
               "WHERE queue = '%s'" % queue) == "2|7"
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--limit", "5", "--max-attempts", "1")
    assert code == 75, output
    code, output = client.run("batchq-pgqueue-enqueue", "--stats", "--queue", queue)
    assert code == 0, output
    host = client.shell("cat /etc/hostname").strip()
    assert json.loads(output) == {"states": {"done": 5, "queued": 2}, "done_by_host": {host: 5}}, output


# The session's settings as the batch's connection has them once configured:
# what the startup options set wins, every other one takes the consumer's value.
SESSION_SHOWN = """
import json, os, sys
sys.path.insert(0, "%s")
import batchq_pgqueue as pgqueue
conn = pgqueue.psycopg.connect(os.environ.get("BATCHQ_PG_DSN", ""), **pgqueue.connection_options())
pgqueue.configure_session(conn)
cursor = conn.cursor()
cursor.execute("SELECT current_setting('lock_timeout'), current_setting('statement_timeout'), "
               "current_setting('idle_in_transaction_session_timeout'), current_setting('search_path'), "
               "current_setting('idle_session_timeout')")
print(json.dumps(cursor.fetchone()))
""" % LIBRARY_DIR


def session_settings(client, env):
    done = docker(*client.argv("python3", ["-c", SESSION_SHOWN], env, None), check=False)
    assert done.returncode == 0, done.stdout
    return json.loads(done.stdout)


def test_the_startup_options_keep_their_settings_and_the_others_take_the_consumers(client):
    # idle_session_timeout too (PostgreSQL 14 and later): a batch is idle between its jobs' transactions
    assert session_settings(client, {}) == ["5s", "30s", "1min", '"$user", public', "1min"]
    # libpq's own forms: -c NAME=VALUE, -cNAME=VALUE, --NAME=VALUE (dashes for underscores), an escaped space
    options = r"-c statement_timeout=7s -clock_timeout=2s --idle-in-transaction-session-timeout=9s " \
              r"-c search_path=public,\ pg_catalog -c idle_session_timeout=4s"
    assert session_settings(client, {"PGOPTIONS": options}) == ["2s", "7s", "9s", "public, pg_catalog", "4s"]
    default_path = '"$user", public'
    assert session_settings(client, {"PGOPTIONS": "-c statement_timeout=7s"}) == [
        "5s", "7s", "1min", default_path, "1min"]
    assert session_settings(client, {"BATCHQ_PG_DSN": "options='-c lock_timeout=3s'"})[:2] == ["3s", "30s"]


def test_a_batch_whose_work_outlasts_the_idle_timeouts_commits(client, queue):
    # 4 s a job, 2 jobs: each job outlasts the timeouts (the batch's heartbeats keep it), and
    # stays within --job-timeout.
    jobs = 2
    enqueue(client, queue, jobs)
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--limit", "100", "--work-ms", "4000",
                              state="/tmp/" + queue, timeout=60,
                              env={"PGOPTIONS": "-c idle_in_transaction_session_timeout=%ds -c idle_session_timeout=%ds"
                                                % (IDLE_S, IDLE_S)})
    assert code == 0, output
    assert states(queue) == {"done": jobs}
    assert sql("SELECT count(*) FROM batchq_results r JOIN batchq_jobs j ON j.id = r.job_id "
               "WHERE j.queue = '%s'" % queue) == str(jobs)


def test_a_job_that_outlasts_its_job_timeout_fails_alone(client, queue):
    # PGOPTIONS, as a consumer's environment sets it, comes after the consumer's own options: the batch
    # speaks while a job works, so the server does not end it even past its idle-in-transaction timeout.
    enqueue(client, queue, 3)
    sql("UPDATE batchq_jobs SET payload = payload || '{\"sleep\": 6}' WHERE queue = '%s' AND payload->>'n' = '2'"
        % queue)
    began = time.monotonic()
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--job-timeout", "4", "--work-ms", "10",
                              state="/tmp/" + queue, env={"PGOPTIONS": "-c idle_in_transaction_session_timeout=2s"})
    assert code == 0, output
    assert 4 <= time.monotonic() - began < 6, "not ended by --job-timeout"
    assert jobs(queue) == [(1, "done", 1), (2, "queued", 1), (3, "done", 1)]
    assert "job %s attempt 1 failed: its work outlasted --job-timeout (4s)" % job_id(queue, 2) in output, output


@pytest.mark.one_driver
def test_max_seconds_ends_a_batch_that_would_outlast_its_timeout(client, queue):
    enqueue(client, queue, 10)
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--limit", "20", "--work-ms", "500",
                              "--max-seconds", "1.2", state="/tmp/" + queue)
    assert code == 75, output  # work left: the next batch at once
    got = states(queue)
    assert 1 <= got.get("done", 0) < 10 and got.get("done", 0) + got.get("queued", 0) == 10, got
    end = client.records("/tmp/" + queue)[-1]
    wanted = ("end", "committed", got["done"], got["queued"])
    assert (end["event"], end["outcome"], end["done"], end["left"]) == wanted, end


def test_loop_runs_batch_after_batch_while_work_waits(client, queue):
    # benchmarks/fleet.sh's long-lived worker: full batches say more work waits, and the next begins at once
    state = "/tmp/" + queue
    enqueue(client, queue, 25)
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--limit", "10", "--loop", state=state)
    assert code == 0, output  # the last batch, 5 jobs, found nothing more due
    assert states(queue) == {"done": 25}
    assert [len(r["ids"]) for r in client.records(state) if r["event"] == "claim"] == [10, 10, 5]


def kill_batch(client, state):
    """SIGKILL to a batch started by client.start and to the child doing its work."""
    client.shell("kill -KILL $(cat {0}/pid) $(ps -o pid= --ppid $(cat {0}/pid))".format(state))


def wait_claimed(client, queue):
    return wait_for(lambda: claimed(client, "/tmp/" + queue), 60, "the batch's claim")


def test_sigterm_commits_what_is_done_and_says_more_work_waits(client, queue):
    state = "/tmp/" + queue
    enqueue(client, queue, 10)
    batch = client.start(["/usr/local/bin/batchq-pgqueue", "--queue", queue, "--limit", "20", "--work-ms", "700"],
                         state + "/pid", state=state)
    try:
        # once a job is done (committed as it ended): the job at work then is stopped and goes back
        wait_for(lambda: states(queue).get("done", 0) >= 1, 30, "a job done")
        client.shell("kill -TERM $(cat %s/pid)" % state)
        output = batch.communicate(timeout=60)[0]
    finally:
        batch.kill()
    assert batch.returncode == 75, output  # not 143: a clean stop, and work waits
    got = states(queue)
    end = client.records(state)[-1]
    assert (end["event"], end["outcome"]) == ("end", "terminated"), end
    assert got.get("done", 0) == end["done"] and got.get("queued", 0) == end["left"] > 0, (got, end)
    assert sql("SELECT count(*) FROM batchq_results r JOIN batchq_jobs j ON j.id = r.job_id "
               "WHERE j.queue = '%s'" % queue) == str(end["done"])
    # the jobs it did not begin, and the one it stopped, are due again at once; the attempt counted at the
    # claim stays counted
    assert sql("SELECT count(*) FROM batchq_jobs WHERE queue = '%s' AND state = 'queued' AND attempts = 1 "
               "AND run_at <= now()" % queue) == str(end["left"])


def test_a_drain_stopped_in_a_batch_ends_as_a_success(client, queue):
    # As `systemctl stop` (a shutdown, a removal) does: SIGTERM to the runner and the batch alike.
    state = "/tmp/" + queue
    enqueue(client, queue, 30)
    client.shell("printf %%s %s >%s/spec.json" % (shlex.quote(drain_runner.spec(timeout_s=120, stop_timeout_s=30)), state))
    drain = client.start(["/usr/bin/python3", "/usr/local/bin/batchq-drain"] + drain_runner.arguments(
        state + "/spec.json", ["/usr/local/bin/batchq-pgqueue", "--queue", queue, "--limit", "10", "--work-ms", "300"]),
        state + "/pid", state=state)
    try:
        # in its second batch, so that the first's backlog exit went on at once
        wait_for(lambda: len(claimed(client, state)) >= 2, 60, "the drain's second batch")
        client.shell("kill -TERM $(cat {0}/pid) $(ps -o pid= --ppid $(cat {0}/pid))".format(state))
        output = drain.communicate(timeout=60)[0]
    finally:
        drain.kill()
    # The batch said more work waits (75), but a stop is a stop: the runner
    # exits 0, a success that batchq.continue@ does not continue.
    assert drain.returncode == 0, output
    ends = [r for r in client.records(state) if r["event"] == "end"]
    assert [r["outcome"] for r in ends] == ["committed", "terminated"], ends
    got = states(queue)
    assert got.get("done", 0) == 10 + ends[-1]["done"] and got.get("queued", 0) == 20 - ends[-1]["done"], (got, ends)


@pytest.mark.one_driver
def test_the_records_stay_bounded(client, queue):
    state = "/tmp/" + queue
    enqueue(client, queue, 400)
    limit = 3000
    for _batch in range(40):
        code, output = client.run("batchq-pgqueue", "--queue", queue, "--limit", "10", "--records-bytes", str(limit),
                                  state=state)
        assert code in (0, 75), output
    assert states(queue) == {"done": 400}
    # the last line may have just filled batches.jsonl, which is then batches.jsonl.1 until the next one
    sizes = client.shell("cd %s && wc -c <batches.jsonl.1 && (wc -c 2>/dev/null <batches.jsonl || echo 0) && ls"
                         % state)
    older, newer = map(int, sizes.split()[:2])
    assert set(sizes.split()[2:]) <= {"batches.jsonl", "batches.jsonl.1"} and "batches.jsonl.1" in sizes, sizes
    records = client.records(state)
    longest = max(len(json.dumps(r)) + 1 for r in records)
    assert older <= limit + longest and newer < limit, sizes
    # the newest records, in order and whole: the last batch's claim and end close them
    assert [r["event"] for r in records[-2:]] == ["claim", "end"] and records[-1]["batch"] == records[-2]["batch"]
    assert sum(len(r["ids"]) for r in records if r["event"] == "claim") < 400  # older ones were dropped


def test_each_job_fails_alone_whatever_its_work_does(client, queue):
    # A crash (SIGSEGV), a TypeError and a KeyError (a payload without "n"): each fails its
    # own job, once per attempt, and the others of the batch commit.
    code, output = client.run("batchq-pgqueue-enqueue", "8", "--queue", queue, "--crashing", "1", "--raising", "1")
    assert code == 0, output
    sql("UPDATE batchq_jobs SET payload = '{}' WHERE queue = '%s' AND payload->>'n' = '7'" % queue)
    options = ("--queue", queue, "--max-attempts", "2", "--backoff-base", "0.2")
    code, output = client.run("batchq-pgqueue", *options, state="/tmp/" + queue)
    assert code == 0, output  # the failed jobs back off: none due at the commit
    crashed, raised = (int(job_id(queue, n)) for n in (4, 5))
    assert "job %d attempt 1 failed: its work's process was killed by SIGSEGV before it reported" % crashed in output, \
        output
    assert "job %d attempt 1 failed: TypeError: job payload asks to raise" % raised in output, output
    assert "KeyError: 'n'" in output, output
    assert [state for _n, state, _attempts in jobs(queue)] == ["done"] * 3 + ["queued"] * 2 + ["done", "queued", "done"]
    # due again after the backoff: the second attempt is their last
    wait_for(lambda: sql("SELECT bool_and(run_at <= now()) FROM batchq_jobs WHERE queue = '%s'" % queue) == "t", 5,
             "the backoff to pass")
    code, output = client.run("batchq-pgqueue", *options, state="/tmp/" + queue)
    assert code == 1, output  # every job of this batch failed: a failed run, not a backlog
    assert 'batch {"claimed": 3, "dead": 3, "done": 0, "failed": 0, "released": 0}, exit 1' in output, output
    assert [(state, attempts) for _n, state, attempts in jobs(queue) if state != "done"] == [("dead", 2)] * 3
    assert results(queue) == 5
    assert sql("SELECT last_error FROM batchq_jobs WHERE id = %d" % crashed) == \
        "its work's process was killed by SIGSEGV before it reported"


def test_a_database_error_of_one_job_fails_that_job_only(client, queue):
    # A real refusal by the server, as a constraint of your own tables would make: a trigger on the results.
    sql("""CREATE OR REPLACE FUNCTION pg_temp_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF (SELECT payload ? 'refuse' FROM batchq_jobs WHERE id = NEW.job_id) THEN
               RAISE EXCEPTION 'result of job % refused', NEW.job_id;
             END IF;
             RETURN NEW;
           END $$;
           CREATE OR REPLACE TRIGGER refuse BEFORE INSERT ON batchq_results FOR EACH ROW EXECUTE FUNCTION pg_temp_refuse();""")
    enqueue(client, queue, 5)
    sql("UPDATE batchq_jobs SET payload = payload || '{\"refuse\": true}' WHERE queue = '%s' AND payload->>'n' = '3'"
        % queue)
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--max-attempts", "1", state="/tmp/" + queue)
    assert code == 0, output
    assert jobs(queue) == [(1, "done", 1), (2, "done", 1), (3, "dead", 1), (4, "done", 1), (5, "done", 1)]
    assert results(queue) == 4
    refused = job_id(queue, 3)
    assert sql("SELECT last_error FROM batchq_jobs WHERE id = %s" % refused).startswith(
        "its result was refused: result of job %s refused" % refused)


def test_a_result_refused_at_its_commit_fails_that_job_only(client, queue):
    # A deferred constraint of your own tables refuses only at the commit: the job's own commit.
    sql("""CREATE OR REPLACE FUNCTION pg_temp_refuse_late() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF (SELECT payload ? 'refuse_late' FROM batchq_jobs WHERE id = NEW.job_id) THEN
               RAISE EXCEPTION 'result of job % refused at the commit', NEW.job_id;
             END IF;
             RETURN NULL;
           END $$;
           DROP TRIGGER IF EXISTS refuse_late ON batchq_results;
           CREATE CONSTRAINT TRIGGER refuse_late AFTER INSERT ON batchq_results DEFERRABLE INITIALLY DEFERRED
             FOR EACH ROW EXECUTE FUNCTION pg_temp_refuse_late();""")
    enqueue(client, queue, 5)
    sql("UPDATE batchq_jobs SET payload = payload || '{\"refuse_late\": true}' WHERE queue = '%s' "
        "AND payload->>'n' = '2'" % queue)
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--max-attempts", "2", state="/tmp/" + queue)
    assert code == 0, output  # the refused job backs off: none due at the end
    assert jobs(queue) == [(1, "done", 1), (2, "queued", 1), (3, "done", 1), (4, "done", 1), (5, "done", 1)]
    assert results(queue) == 4
    refused = job_id(queue, 2)
    assert sql("SELECT last_error FROM batchq_jobs WHERE id = %s" % refused).startswith(
        "its result was refused: result of job %s refused at the commit" % refused)


# Each outcome of a job in one statement, with the statements a backend sends counted by a
# cursor of the driver's own class.
OUTCOME_STATEMENTS = """
import argparse, json, os, sys
sys.path.insert(0, "%s")
import batchq_pgqueue as pgqueue, batchq_queue
psycopg = pgqueue.psycopg
sent = []

class Counting(psycopg.extensions.cursor if hasattr(psycopg, "extensions") else psycopg.Cursor):
    def execute(self, query, params=None, **options):
        sent.append(str(query))
        return super().execute(query, params, **options)

parser = argparse.ArgumentParser()
batchq_queue.add_common_options(parser)
pgqueue.add_options(parser)

def backend(*argv):
    return pgqueue.PgBackend(parser.parse_args(["--queue", sys.argv[1], *argv]), connect=lambda: psycopg.connect(
        os.environ.get("BATCHQ_PG_DSN", ""), cursor_factory=Counting, **pgqueue.connection_options()))

def statements(call, *values):
    del sent[:]
    answer = call(*values)
    return len(sent), answer

# --commit-delay 0: each outcome at once
each = backend("--commit-delay", "0")
jobs = each.claim(3)
counts = [statements(call, job, *values)[0] for job, call, values in zip(
    jobs, (each.done, each.failed, each.dead), (['"its result"'], ["its error", 3600], ["its last error"]))]
# the default: two done jobs held, then written together
held = backend()
first, second = held.claim(2)
counts += [statements(held.done, first, '"held"')[0], statements(held.done, second, '{"n": 2}')[0]]
sent_count, written = statements(held.flush, True)
print(json.dumps([counts, sent_count, [[job.id, refusal] for job, refusal in written]]))
""" % LIBRARY_DIR


def test_each_outcome_of_a_job_is_one_statement_that_commits_on_its_own(client, queue):
    # A statement per outcome, not BEGIN, the writes and COMMIT: each statement costs a round trip and
    # CPU on both sides. Done jobs held (--commit-delay) share one statement. The outcomes are there
    # once the batch's session is closed: they committed.
    enqueue(client, queue, 5)
    done = docker(*client.argv("python3", ["-c", OUTCOME_STATEMENTS, queue], {}, None), check=False)
    assert done.returncode == 0, done.stdout
    assert json.loads(done.stdout) == [[1, 1, 1, 0, 0], 1, [[int(job_id(queue, 4)), None], [int(job_id(queue, 5)), None]]]
    assert jobs(queue) == [(1, "done", 1), (2, "queued", 1), (3, "dead", 1), (4, "done", 1), (5, "done", 1)]
    assert sql("SELECT r.result FROM batchq_results r JOIN batchq_jobs j ON j.id = r.job_id "
               "WHERE j.queue = '%s' ORDER BY j.id" % queue).splitlines() == ["its result", "held", '{"n": 2}']
    assert sql("SELECT coalesce(last_error, '-') FROM batchq_jobs WHERE queue = '%s' ORDER BY id"
               % queue).splitlines() == ["-", "its error", "its last error", "-", "-"]


def test_an_outage_is_a_failed_run_and_backs_off(client, queue):
    enqueue(client, queue, 20)
    client.shell("touch /tmp/%s/down" % queue)
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--limit", "10", "--backoff-base", "30",
                              "--fail-while", "/tmp/%s/down" % queue, state="/tmp/" + queue)
    assert code == 1, output  # not the backlog exit: the next batch waits the interval
    waits = sql("SELECT extract(epoch FROM run_at - claimed_at) FROM batchq_jobs WHERE queue = '%s' "
                "AND state = 'queued' AND attempts = 1" % queue).split()
    # --backoff-base 30: at least 30 s, at most twice that (--backoff-min 60, the upper half of it at random)
    assert len(waits) == 10 and all(30 <= float(wait) <= 60 + 1 for wait in waits), waits
    # the service is back: the due jobs drain, the others wait their backoff (a batch with room to spare)
    client.shell("rm /tmp/%s/down" % queue)
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--limit", "20", "--fail-while",
                              "/tmp/%s/down" % queue, state="/tmp/" + queue)
    assert code == 0 and states(queue) == {"done": 10, "queued": 10}, output


@pytest.mark.one_driver
def test_the_default_backoff_outlasts_a_day_of_outage(client):
    # from the consumer's own defaults, each wait the shortest its jitter allows
    script = """import argparse, sys
sys.path.insert(0, "%s")
import batchq_pgqueue, batchq_queue
parser = argparse.ArgumentParser()
batchq_queue.add_common_options(parser)
batchq_pgqueue.add_options(parser)
a = parser.parse_args([])
print(a.max_attempts, sum(batchq_queue.backoff(n, a.backoff_min, a.backoff_max, lambda low, high: low)
                          for n in range(1, a.max_attempts)))""" % LIBRARY_DIR
    attempts, waited = client.shell("python3 -c '%s'" % script).split()
    assert int(attempts) == 25 and float(waited) >= 24 * 3600, (attempts, waited)


def test_the_jobs_of_a_killed_batch_are_taken_again_at_once(client, queue):
    # SIGKILL of the batch and its work: its claim's attempt is counted, nothing of it applied,
    # and the next batch takes its jobs back at once: their claim lock went with the session.
    state = "/tmp/" + queue
    enqueue(client, queue, 5)
    batch = client.start(["/usr/local/bin/batchq-pgqueue", "--queue", queue, "--work-ms", "2000"], state + "/pid",
                         state=state)
    try:
        wait_claimed(client, queue)
        kill_batch(client, state)
        batch.communicate(timeout=60)
    finally:
        batch.kill()
    assert jobs(queue) == [(n, "running", 1) for n in range(1, 6)]
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--max-attempts", "2", state=state)
    # (its summary on stdout; the library's lines on stderr, which docker exec may pass on first)
    assert code == 0 and "\ncommitted: 5 jobs claimed, 5 done" in "\n" + output, output
    assert jobs(queue) == [(n, "done", 2) for n in range(1, 6)]
    assert results(queue) == 5


def batch_session(token, columns):
    """columns of pg_stat_activity for the session of the batch run with INVOCATION_ID token ('' if none)."""
    return sql("SELECT %s FROM pg_stat_activity WHERE application_name LIKE '%%/%s#%%'" % (columns, token))


@pytest.mark.one_driver
def test_a_live_batchs_jobs_are_not_taken_however_old_their_claim(client, queue):
    # A batch at work holds its jobs by its session's claim lock, not by the age of their claim.
    state, token = "/tmp/" + queue, uuid.uuid4().hex[:12]
    enqueue(client, queue, 3)
    batch = client.start(["/usr/local/bin/batchq-pgqueue", "--queue", queue, "--work-ms", "1500"], state + "/pid",
                         env={"INVOCATION_ID": token}, state=state)
    try:
        wait_claimed(client, queue)
        sql("UPDATE batchq_jobs SET claimed_at = claimed_at - interval '1 hour' WHERE queue = '%s'" % queue)
        code, output = client.run("batchq-pgqueue", "--queue", queue, state=state)
        assert code == 0 and "\ncommitted: 0 jobs claimed" in "\n" + output, output
        assert batch.poll() is None, "the first batch ended before the second claimed"
        output = batch.communicate(timeout=60)[0]
    finally:
        batch.kill()
    assert batch.returncode == 0, output
    assert jobs(queue) == [(n, "done", 1) for n in (1, 2, 3)] and results(queue) == 3


def test_a_killed_batch_keeps_the_jobs_it_did_and_held_no_transaction_while_a_job_worked(client, queue):
    # Each job's outcome commits as the job ends. A batch SIGKILLed at its fifth job keeps the four
    # it did and charges them nothing more. While the fifth works, the batch's session is idle
    # outside any transaction: a long batch holds back no VACUUM.
    state, token = "/tmp/" + queue, uuid.uuid4().hex[:12]
    enqueue(client, queue, 5)
    sql("UPDATE batchq_jobs SET payload = payload || '{\"sleep\": 60}' WHERE queue = '%s' AND payload->>'n' = '5'"
        % queue)
    batch = client.start(["/usr/local/bin/batchq-pgqueue", "--queue", queue, "--job-timeout", "120"],
                         state + "/pid", env={"INVOCATION_ID": token}, state=state)
    try:
        wait_for(lambda: states(queue).get("done") == 4, 30, "the first four jobs done")
        # (between two heartbeats of the batch, a second apart)
        wait_for(lambda: batch_session(token, "state, backend_xid IS NULL, backend_xmin IS NULL") == "idle|t|t", 10,
                 "the batch's session idle, outside a transaction, while the fifth job works")
        kill_batch(client, state)
        batch.communicate(timeout=60)
    finally:
        batch.kill()
    assert jobs(queue) == [(n, "done", 1) for n in range(1, 5)] + [(5, "running", 1)]
    assert results(queue) == 4
    sql("UPDATE batchq_jobs SET payload = payload - 'sleep' WHERE queue = '%s'" % queue)
    code, output = client.run("batchq-pgqueue", "--queue", queue, state=state)
    assert code == 0 and "\ncommitted: 1 jobs claimed, 1 done" in "\n" + output, output
    assert jobs(queue) == [(n, "done", 1) for n in range(1, 5)] + [(5, "done", 2)]
    assert results(queue) == 5


def test_a_lost_session_ends_the_batch_at_once_and_its_report_counts_only_what_committed(client, queue):
    state, token = "/tmp/" + queue, uuid.uuid4().hex[:12]
    enqueue(client, queue, 20)
    batch = client.start(["/usr/local/bin/batchq-pgqueue", "--queue", queue, "--work-ms", "1000"], state + "/pid",
                         env={"INVOCATION_ID": token}, state=state)
    try:
        wait_for(lambda: states(queue).get("done", 0) >= 2, 30, "two jobs done")
        assert sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE "
                   "'%%/%s#%%'" % token) == "1"
        began = time.monotonic()
        output = batch.communicate(timeout=60)[0]
        took = time.monotonic() - began
    finally:
        batch.kill()
    # 18 jobs of 1 s each were left: the one at work ends, and no other starts
    print("a terminated session ended the batch in %.1f s" % took)
    assert batch.returncode == 1 and took < 4, (took, output)
    done = states(queue).get("done", 0)
    assert re.findall(r'"done": (\d+)', output) == [str(done)], output  # the library's count of the batch
    end = client.records(state)[-1]
    assert (end["event"], end["outcome"], end["done"]) == ("end", "error", done), end
    assert results(queue) == done
    # the others' claim lock went with the session: the next batch takes them back at once
    code, output = client.run("batchq-pgqueue", "--queue", queue, state=state)
    assert code == 0 and states(queue) == {"done": 20} and results(queue) == 20, output
    assert sorted(attempts for _n, _state, attempts in jobs(queue)) == [1] * done + [2] * (20 - done)


def test_a_cut_network_ends_the_batch_within_the_connections_bounds(client, queue):
    # The client's network is gone (a cable cut): the batch's next statement fails within
    # tcp_user_timeout (10 s), and no job starts after it. The database itself goes on.
    state, token = "/tmp/" + queue, uuid.uuid4().hex[:12]
    enqueue(client, queue, 40)
    batch = client.start(["/usr/local/bin/batchq-pgqueue", "--queue", queue, "--work-ms", "1000"], state + "/pid",
                         env={"INVOCATION_ID": token}, state=state)
    try:
        wait_for(lambda: states(queue).get("done", 0) >= 2, 30, "two jobs done")
        docker("network", "disconnect", NETWORK, client.name)
        try:
            began = time.monotonic()
            output = batch.communicate(timeout=60)[0]
            took = time.monotonic() - began
        finally:
            docker("network", "connect", NETWORK, client.name)
    finally:
        batch.kill()
    # 38 jobs of 1 s each were left: the batch ended within the connection's bounds, long before
    print("a cut network ended the batch in %.1f s" % took)
    assert batch.returncode == 1 and took < 20, (took, output)
    done = states(queue).get("done", 0)
    assert re.findall(r'"done": (\d+)', output) == [str(done)], output
    assert client.records(state)[-1]["outcome"] == "error" and results(queue) == done


def test_a_sigterm_during_the_claim_cancels_it_and_nothing_is_claimed(client, queue):
    # The claim waits for a lock: here the whole table's, as a schema change takes it (the batch's
    # lock_timeout is raised so that it waits). SIGTERM ends the batch at once, its claim rolled back.
    state, token = "/tmp/" + queue, uuid.uuid4().hex[:12]
    enqueue(client, queue, 5)
    holder = subprocess.Popen(
        ["docker", "exec", DATABASE, "runuser", "-u", "postgres", "--", "psql", "-X",
         "dbname=batchq application_name=holder-" + token,
         "-c", "BEGIN; LOCK TABLE batchq_jobs IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(60); COMMIT"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: sql("SELECT count(*) FROM pg_locks WHERE relation = 'batchq_jobs'::regclass "
                             "AND mode = 'AccessExclusiveLock' AND granted") == "1", 30, "the table's lock")
        batch = client.start(["/usr/local/bin/batchq-pgqueue", "--queue", queue], state + "/pid", state=state,
                             env={"INVOCATION_ID": token, "PGOPTIONS": "-c lock_timeout=60s"})
        try:
            wait_for(lambda: batch_session(token, "wait_event_type") == "Lock", 30, "the claim to wait for the lock")
            began = time.monotonic()
            client.shell("kill -TERM $(cat %s/pid)" % state)
            output = batch.communicate(timeout=20)[0]
            took = time.monotonic() - began
        finally:
            batch.kill()
    finally:
        sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'holder-%s'" % token)
        holder.communicate(timeout=60)
    print("a SIGTERM during the claim ended the batch in %.1f s" % took)
    assert batch.returncode == 0 and took < 3, (took, output)
    assert jobs(queue) == [(n, "queued", 0) for n in range(1, 6)], output
    assert not claimed(client, state)
    end = client.records(state)[-1]
    assert (end["event"], end["outcome"], end["claimed"]) == ("end", "terminated", 0), end


# A SIGTERM that systemd sends while the batch connects: before its claim.
STOPPED_WHILE_CONNECTING = """
import os, signal, sys
sys.path.insert(0, "%s")
import batchq_pgqueue, batchq_queue
connect = batchq_pgqueue.psycopg.connect
def connect_and_stop(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return connect(*args, **kwargs)
batchq_pgqueue.psycopg.connect = connect_and_stop
sys.exit(batchq_pgqueue.main(sys.argv[1:], batchq_queue.stand_in))
""" % LIBRARY_DIR


def test_a_sigterm_before_the_claim_claims_nothing(client, queue):
    state = "/tmp/" + queue
    enqueue(client, queue, 3)
    done = docker(*client.argv("python3", ["-c", STOPPED_WHILE_CONNECTING, "--queue", queue], {}, state),
                  check=False)
    assert done.returncode == 0, done.stdout
    assert jobs(queue) == [(n, "queued", 0) for n in (1, 2, 3)], done.stdout
    assert not claimed(client, state)


@pytest.mark.one_driver
def test_a_job_an_older_consumer_claimed_is_taken_back_only_past_the_grace(client, queue):
    # A consumer of before claim_lock held a running job by its batch's row lock. Such a job, when no
    # transaction locks it, is taken back CLAIM_GRACE after its claim (its claim and lock were two steps).
    enqueue(client, queue, 1)
    sql("UPDATE batchq_jobs SET state = 'running', attempts = 1, claimed_by = 'older', claimed_at = now() "
        "WHERE queue = '%s'" % queue)
    code, output = client.run("batchq-pgqueue", "--queue", queue)
    assert code == 0 and "\ncommitted: 0 jobs claimed" in "\n" + output, output
    sql("UPDATE batchq_jobs SET claimed_at = now() - interval '%d seconds' WHERE queue = '%s'"
        % (CLAIM_GRACE_S + 1, queue))
    code, output = client.run("batchq-pgqueue", "--queue", queue)
    assert code == 0 and "\ncommitted: 1 jobs claimed, 1 done" in "\n" + output, output
    assert jobs(queue) == [(1, "done", 2)]


def done_jobs(queue, since):
    """The done jobs of queue (with their results) whose done_at is since ago, as by batchq-pgqueue."""
    sql("""WITH job AS (INSERT INTO batchq_jobs (queue, payload, state, attempts, done_at, done_by)
                        SELECT '%s', '{}', 'done', 1, now() - interval '%s', 'an earlier batch'
                        FROM generate_series(1, %d) RETURNING id)
           INSERT INTO batchq_results (job_id, result, applied_by) SELECT id, 'r', 'an earlier batch' FROM job"""
        % (queue, since[1], since[0]))


def ages(queue):
    """Done jobs of queue by their age in days, rounded down; dead and queued ones by state; and results."""
    rows = sql("SELECT CASE WHEN state = 'done' THEN extract(day FROM now() - done_at)::text ELSE state END, "
               "count(*) FROM batchq_jobs WHERE queue = '%s' GROUP BY 1" % queue)
    got = {key: int(count) for key, count in (line.split("|") for line in rows.splitlines())}
    return got, results(queue)


@pytest.mark.one_driver
def test_done_jobs_older_than_keep_done_days_are_deleted_a_chunk_a_batch(client, queue):
    state = "/tmp/" + queue
    done_jobs(queue, (2 * PRUNE_ROWS + 500, "8 days"))
    done_jobs(queue, (10, "6 days"))
    sql("INSERT INTO batchq_jobs (queue, payload, state, attempts) VALUES ('%s', '{}', 'dead', 5)" % queue)
    sql("UPDATE batchq_jobs SET enqueued_at = now() - interval '30 days' WHERE queue = '%s' AND state = 'dead'"
        % queue)
    # --keep-done-days 0 keeps them all
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--keep-done-days", "0", state=state)
    assert code == 0, output
    assert ages(queue) == ({"8": 2 * PRUNE_ROWS + 500, "6": 10, "dead": 1}, 2 * PRUNE_ROWS + 510)
    # the default, 7 days: each batch deletes at most PRUNE_ROWS of them, with their results
    for pruned, left in ((PRUNE_ROWS, PRUNE_ROWS + 500), (PRUNE_ROWS, 500), (500, 0)):
        code, output = client.run("batchq-pgqueue", "--queue", queue, "--limit", "10", state=state)
        assert code == 0, output
        assert client.records(state)[-1]["pruned"] == pruned
        older = {"8": left} if left else {}
        assert ages(queue) == (dict(older, **{"6": 10, "dead": 1}), left + 10)


def test_the_statement_in_schema_sql_prunes_by_hand(queue):
    text = (EXAMPLE / "schema.sql").read_text()
    lines = text.split("To prune by hand")[1].splitlines()[1:]
    statement = "\n".join(line[5:] for line in lines if line.startswith("--   "))
    done_jobs(queue, (3, "8 days"))
    done_jobs(queue, (2, "6 days"))
    sql(statement)
    assert ages(queue) == ({"6": 2}, 2)


def test_a_job_that_kills_every_batch_ends_dead_after_its_attempts(client, queue):
    state = "/tmp/" + queue
    enqueue(client, queue, 1)
    for attempt in (1, 2):
        batch = client.start(["/usr/local/bin/batchq-pgqueue", "--queue", queue, "--max-attempts", "2",
                              "--work-ms", "5000"], state + "/pid", state=state)
        try:
            wait_for(lambda: jobs(queue) == [(1, "running", attempt)], 30, "attempt %d's claim" % attempt)
            kill_batch(client, state)
            batch.communicate(timeout=60)
        finally:
            batch.kill()
    # its claim lock went with the killed batch: the next claim buries it instead of trying a third time
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--max-attempts", "2", state=state)
    assert code == 0 and "\ncommitted: 0 jobs claimed" in "\n" + output, output
    assert jobs(queue) == [(1, "dead", 2)]
    assert sql("SELECT last_error FROM batchq_jobs WHERE queue = '%s'" % queue) == \
        "its batch ended without finishing it, attempt 2 of 2"


# The first version of schema.sql (as released before attempts were counted at claim), to upgrade.
FIRST_SCHEMA = """
CREATE TABLE IF NOT EXISTS batchq_jobs (
    id          bigserial PRIMARY KEY,
    queue       text NOT NULL DEFAULT 'default',
    payload     jsonb NOT NULL,
    state       text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'done', 'dead')),
    attempts    integer NOT NULL DEFAULT 0,
    last_error  text,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    done_at     timestamptz,
    done_by     text
);
CREATE INDEX IF NOT EXISTS batchq_jobs_queued ON batchq_jobs (queue, id) WHERE state = 'queued';
CREATE TABLE IF NOT EXISTS batchq_results (
    job_id     bigint NOT NULL REFERENCES batchq_jobs (id),
    result     text NOT NULL,
    applied_by text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS batchq_results_job ON batchq_results (job_id);
"""


@pytest.mark.one_driver
def test_schema_sql_upgrades_a_table_of_the_first_version_in_place(client):
    # In a schema of its own (the consumer finds it by search_path), as database.yml applies it.
    schema = "first_" + client.driver
    sql("DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s AUTHORIZATION batchq" % (schema, schema))

    def apply(text):
        return docker("exec", "-i", DATABASE, "runuser", "-u", "postgres", "--", "psql", "-d", "batchq", "-X",
                      "-v", "ON_ERROR_STOP=1", "-c", "SET ROLE batchq", "-c", "SET search_path = " + schema,
                      "-f", "-", input=text).stdout

    apply(FIRST_SCHEMA + "INSERT INTO batchq_jobs (payload) SELECT jsonb_build_object('n', n) "
                         "FROM generate_series(1, 3) AS n;"
                         "INSERT INTO batchq_jobs (payload, state, attempts) VALUES ('{\"n\": 4}', 'dead', 5);")
    schema_sql = (EXAMPLE / "schema.sql").read_text()
    assert "batchq_jobs upgraded" in apply(schema_sql)
    assert "batchq_jobs upgraded" not in apply(schema_sql)  # once only
    code, output = client.run("batchq-pgqueue", env={"PGOPTIONS": "-c search_path=" + schema})
    assert code == 0, output
    assert sql("SELECT string_agg(state || ':' || attempts, ',' ORDER BY id) FROM %s.batchq_jobs" % schema) == \
        "done:1,done:1,done:1,dead:5"
    assert sql("SELECT count(*) FROM %s.batchq_results" % schema) == "3"
    # A table of the second version (claims, but no claim_lock nor index of done jobs) upgrades as well.
    upgraded = "SELECT (SELECT count(*) FROM pg_attribute WHERE attrelid = '{0}.batchq_jobs'::regclass " \
               "AND attname = 'claim_lock' AND NOT attisdropped), to_regclass('{0}.batchq_jobs_done')"
    assert sql(upgraded.format(schema)) == "1|%s.batchq_jobs_done" % schema
    apply("ALTER TABLE batchq_jobs DROP COLUMN claim_lock; DROP INDEX batchq_jobs_done;")
    assert "batchq_jobs upgraded: claim_lock" in apply(schema_sql)
    assert sql(upgraded.format(schema)) == "1|%s.batchq_jobs_done" % schema


# Hostile jobs and options: one job's odd failure or payload never fails its neighbours
def test_an_error_text_the_database_cannot_hold_as_it_is_fails_that_job_alone(client, queue):
    enqueue(client, queue, 5)
    for n, kind in ((2, "nul"), (3, "surrogate"), (4, "huge")):
        sql("UPDATE batchq_jobs SET payload = payload || '{\"raise\": \"%s\"}' WHERE queue = '%s' AND payload->>'n' = '%d'"
            % (kind, queue, n))
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--max-attempts", "1", state="/tmp/" + queue)
    assert code == 0, output
    assert jobs(queue) == [(1, "done", 1), (2, "dead", 1), (3, "dead", 1), (4, "dead", 1), (5, "done", 1)]
    errors = sql("SELECT last_error FROM batchq_jobs WHERE queue = '%s' AND state = 'dead' ORDER BY id" % queue)
    nul, surrogate, huge = errors.split("\n")
    assert nul == "TypeError: a NUL \\x00 byte" and surrogate == "TypeError: a lone \\udcff surrogate", errors
    assert huge.startswith("TypeError: xxx") and huge.endswith("... (1048587 characters)") and len(huge) < 2100


def test_an_error_that_names_a_file_whose_name_is_not_utf8_is_kept_escaped(client, queue):
    # A real way to a lone surrogate: Python reads a name that is not UTF-8 (argv, a folder's
    # entries) with a surrogate for each bad byte, and an error text that names the file holds it.
    enqueue(client, queue, 3)
    # the byte 0xff made by the client's shell: docker exec would pass on U+FFFD instead
    down = "/tmp/%s/down$(printf '\\377')" % queue
    client.shell("touch %s" % down)
    done = docker(*client.argv("/bin/sh", ["-c", 'exec batchq-pgqueue --queue %s --max-attempts 1 --fail-while "%s"'
                                           % (queue, down)], {}, "/tmp/" + queue), check=False)
    assert done.returncode == 1, done.stdout  # every job failed: an outage
    assert jobs(queue) == [(n, "dead", 1) for n in (1, 2, 3)], done.stdout
    errors = sql("SELECT DISTINCT last_error FROM batchq_jobs WHERE queue = '%s'" % queue)
    assert errors == "ConnectionError: the service this job calls is down (/tmp/%s/down\\udcff exists)" % queue


def test_a_payload_python_cannot_read_fails_or_is_done_but_never_stalls_the_queue(client, queue):
    enqueue(client, queue, 3)
    # valid jsonb that Python may refuse to decode: a 5000-digit number (Python 3.11 and later
    # refuse it, 3.9 reads it), arrays nested 5000 deep (deeper than Python's decoder recurses)
    sql("INSERT INTO batchq_jobs (queue, payload) VALUES ('%s', '{\"n\": %s}'), ('%s', '%s')"
        % (queue, "9" * 5000, queue, "[" * 5000 + "]" * 5000))
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--max-attempts", "1", state="/tmp/" + queue)
    assert code == 0, output
    rows = sql("SELECT state, attempts FROM batchq_jobs WHERE queue = '%s' ORDER BY id" % queue).splitlines()
    assert rows[:3] == ["done|1"] * 3, rows
    # each is charged its attempt and ends: neither is claimed again
    assert rows[3] in ("done|1", "dead|1") and rows[4] in ("done|1", "dead|1"), rows
    assert "committed: 5 jobs claimed" in output, output


@pytest.mark.one_driver
@pytest.mark.parametrize("options, named", [
    (["--limit", "-5"], "--limit"), (["--max-attempts", "0"], "--max-attempts"),
    (["--max-attempts", "1100"], "--max-attempts"), (["--backoff-base", "0"], "--backoff-base"),
    (["--job-timeout", "nan"], "--job-timeout"), (["--queue", ""], "--queue"),
    (["--records-bytes", "100"], "--records-bytes"), (["--backoff-min", "-1"], "--backoff-min"),
    (["--keep-done-days", "-1"], "--keep-done-days"), (["--keep-done-days", "nan"], "--keep-done-days"),
])
def test_a_bad_option_exits_2_naming_it_before_anything_is_claimed(client, queue, options, named):
    enqueue(client, queue, 3)
    code, output = client.run("batchq-pgqueue", "--queue", queue, *options, state="/tmp/" + queue)
    assert code == 2 and "error: %s: must be" % named in output, output
    assert states(queue) == {"queued": 3}


def test_the_guides_consumer_runs_as_written(client, queue):
    """The 15-line consumer of the writing guide's PostgreSQL section, where deploy.yml puts the modules."""
    guide = (ROOT / "docs" / "docsite" / "rst" / "guide_writing.rst").read_text(encoding="utf-8")
    section = guide.split("A PostgreSQL job table: ``examples/postgresql_queue``\n")[1]
    lines = section.split(".. code-block:: python\n\n")[1].splitlines()
    block = lines[:next(n for n, line in enumerate(lines) if line and not line.startswith("   "))]
    code = "\n".join(line[3:] for line in block).strip() + "\n"
    assert 12 <= len(code.splitlines()) <= 16, code
    assert '"%s"' % LIBRARY_DIR in code
    with tempfile.NamedTemporaryFile("w", suffix=".py") as handle:
        handle.write(code)
        handle.flush()
        docker("cp", handle.name, "%s:/usr/local/bin/guide-consumer" % client.name)
    client.shell("chmod 0755 /usr/local/bin/guide-consumer")
    enqueue(client, queue, 3)
    code, output = client.run("guide-consumer", "--queue", queue)
    assert code == 0, output
    rows = sql("SELECT j.payload->>'n', r.result FROM batchq_results r JOIN batchq_jobs j ON j.id = r.job_id "
               "WHERE j.queue = '%s' ORDER BY 1" % queue)
    assert {n: json.loads(result)["sha256"] for n, result in (line.split("|", 1) for line in rows.splitlines())} == {
        str(n): hashlib.sha256(str(n).encode()).hexdigest() for n in range(1, 4)}
