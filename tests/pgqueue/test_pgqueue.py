"""examples/postgresql_queue against a real PostgreSQL, with psycopg2 and psycopg 3.

Each test has a queue and a records folder (`queue`, /tmp/<queue> in the
client) of its own; everything is judged from the database and the
consumer's own records.
"""

import json
import time

from conftest import sql, states, wait_for

# The example's server-side bound on one job's work (batchq-pgqueue's connection options).
IDLE_IN_TRANSACTION_S = 60


def enqueue(client, queue, count, failing=0):
    code, output = client.run("batchq-pgqueue-enqueue", str(count), "--queue", queue, "--failing", str(failing))
    assert code == 0, output
    assert states(queue) == {"queued": count}


def claimed(client, state):
    return [r for r in client.records(state) if r["event"] == "claim" and r["ids"]]


def test_enqueue_and_stats(client, queue):
    code, output = client.run("batchq-pgqueue-enqueue", "7", "--queue", queue, "--failing", "2")
    assert code == 0, output
    assert output.strip() == "enqueued 7 jobs on queue %s (2 failing)" % queue
    assert sql("SELECT count(*) FILTER (WHERE (payload->>'fail')::boolean), count(*) FROM batchq_jobs "
               "WHERE queue = '%s'" % queue) == "2|7"
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--limit", "5", "--max-attempts", "1")
    assert code == 75, output
    code, output = client.run("batchq-pgqueue-enqueue", "--stats", "--queue", queue)
    assert code == 0, output
    host = client.shell("cat /etc/hostname").strip()
    assert json.loads(output) == {"states": {"done": 5, "queued": 2}, "done_by_host": {host: 5}}, output


def test_a_batch_whose_work_outlasts_the_idle_in_transaction_timeout_commits(client, queue):
    # 2 s a job, 31 jobs: 62 s between the claim and the writes, each job well within the bound.
    jobs = IDLE_IN_TRANSACTION_S // 2 + 1
    enqueue(client, queue, jobs)
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--limit", "100", "--work-ms", "2000",
                              state="/tmp/" + queue, timeout=IDLE_IN_TRANSACTION_S + 60)
    assert code == 0, output
    assert states(queue) == {"done": jobs}
    assert sql("SELECT count(*) FROM batchq_results r JOIN batchq_jobs j ON j.id = r.job_id "
               "WHERE j.queue = '%s'" % queue) == str(jobs)


def test_a_hung_job_is_still_ended_by_the_server(client, queue):
    # PGOPTIONS, as a consumer's environment sets it, comes after the consumer's own options.
    enqueue(client, queue, 1)
    began = time.monotonic()
    code, output = client.run("batchq-pgqueue", "--queue", queue, "--work-ms", "6000", state="/tmp/" + queue,
                              env={"PGOPTIONS": "-c idle_in_transaction_session_timeout=2s"})
    assert code == 1 and "batch rolled back" in output, output
    assert time.monotonic() - began >= 6, "ended before the job's work did"
    assert states(queue) == {"queued": 1}
    assert sql("SELECT attempts FROM batchq_jobs WHERE queue = '%s'" % queue) == "0"


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


def wait_claimed(client, queue):
    return wait_for(lambda: claimed(client, "/tmp/" + queue), 60, "the batch's claim")


def test_sigterm_commits_what_is_done_and_says_more_work_waits(client, queue):
    state = "/tmp/" + queue
    enqueue(client, queue, 10)
    batch = client.start(["/usr/local/bin/batchq-pgqueue", "--queue", queue, "--limit", "20", "--work-ms", "700"],
                         state + "/pid", state=state)
    try:
        wait_claimed(client, queue)
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


def test_a_drain_stopped_in_a_batch_ends_as_a_success(client, queue):
    # As `systemctl stop` (a shutdown, a removal) does: SIGTERM to the runner and the batch alike.
    state = "/tmp/" + queue
    enqueue(client, queue, 30)
    drain = client.start(["/usr/bin/python3", "/usr/local/bin/batchq-drain", "75", "120000000", "30000000", "--",
                          "/usr/local/bin/batchq-pgqueue", "--queue", queue, "--limit", "10", "--work-ms", "300"],
                         state + "/pid", state=state)
    try:
        # in its second batch, so that the first's backlog exit went on at once
        wait_for(lambda: len(claimed(client, state)) >= 2, 60, "the drain's second batch")
        client.shell("kill -TERM $(cat {0}/pid) $(ps -o pid= --ppid $(cat {0}/pid))".format(state))
        output = drain.communicate(timeout=60)[0]
    finally:
        drain.kill()
    # the backlog_exit_code the batch said: a success by the unit's SuccessExitStatus=
    assert drain.returncode == 75, output
    ends = [r for r in client.records(state) if r["event"] == "end"]
    assert [r["outcome"] for r in ends] == ["committed", "terminated"], ends
    got = states(queue)
    assert got.get("done", 0) == 10 + ends[-1]["done"] and got.get("queued", 0) == 20 - ends[-1]["done"], (got, ends)


def test_the_records_stay_bounded(client, queue):
    state = "/tmp/" + queue
    enqueue(client, queue, 400)
    limit = 3000
    for _batch in range(40):
        code, output = client.run("batchq-pgqueue", "--queue", queue, "--limit", "10", "--records-bytes", str(limit),
                                  state=state)
        assert code in (0, 75), output
    assert states(queue) == {"done": 400}
    sizes = client.shell("wc -c <%s/batches.jsonl.1; wc -c <%s/batches.jsonl; ls %s" % (state, state, state))
    older, newer = map(int, sizes.split()[:2])
    assert sorted(sizes.split()[2:]) == ["batches.jsonl", "batches.jsonl.1"], sizes
    records = client.records(state)
    longest = max(len(json.dumps(r)) + 1 for r in records)
    assert older <= limit + longest and newer < limit, sizes
    # the newest records, in order and whole: the last batch's claim and end close them
    assert [r["event"] for r in records[-2:]] == ["claim", "end"] and records[-1]["batch"] == records[-2]["batch"]
    assert sum(len(r["ids"]) for r in records if r["event"] == "claim") < 400  # older ones were dropped
