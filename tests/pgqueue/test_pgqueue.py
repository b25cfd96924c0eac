"""examples/postgresql_queue against a real PostgreSQL, with psycopg2 and psycopg 3.

Each test has a queue and a records folder (`queue`, /tmp/<queue> in the
client) of its own; everything is judged from the database and the
consumer's own records.
"""

import json

from conftest import sql, states


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
