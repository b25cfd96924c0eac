"""A fleet on SQS: three workers drain one queue through real faults and lose no job.

Three of the fleet's workers (Debian 11, 12 and 13: Debian's boto3 1.13, 1.26
and 1.37) get the SQS consumer of examples/sqs_queue, deployed by its
deploy.yml as users do, two instances each. They drain 4000 jobs, a few of
them poison (they crash their process, or raise), from a moto server on a
host of the fleet's network. One worker is killed in the middle of a batch
and started again; another is cut off from the network for 30 s, twice the
visibility timeout, so that SQS gives its messages to the others.

Judged from the server's own record of what it answered (batchq-moto in
files/): each delivery of a message, with its body and receive count, and
each conditional put of a result, stored or refused. And from the queue, the
dead-letter queue and the results table at the end.

Runs after test_fleet.py (file order): that module leaves the PostgreSQL
consumers paused.
"""

import json
import subprocess
import tempfile
import time

import testinfra
import yaml
from testinfra.utils.ansible_runner import AnsibleRunner

from testlib import INVENTORY, SCENARIO_DIR, control, figure, wait_for

JOBS = 4000
CRASHING, RAISING = 3, 3  # jobs spread through the queue whose work kills its process, or raises
POISON = CRASHING + RAISING
MAX_ATTEMPTS = 3  # --max-attempts of the consumer's command
RECEIVES = 5  # the redrive policy's maxReceiveCount: above --max-attempts, as the example asks
VISIBILITY = 15  # --visibility-timeout: a lost batch's messages show again this long after its last renewal
CUT_SECONDS = 2 * VISIBILITY
STALL_SECONDS = 15  # the longest the drain may go without a result stored
BATCH_SECONDS = 300  # a batch's longest life: the consumer's timeout (5 min, the example's)
EXAMPLE = SCENARIO_DIR.parent.parent / "examples" / "sqs_queue"
RUNNER = AnsibleRunner(INVENTORY)
WORKERS = sorted(RUNNER.get_hosts("sqs_workers"))
SERVER = RUNNER.get_hosts("queue_sqs")[0]
KILLED, CUT = WORKERS[0], WORKERS[1]
ENDPOINT = "http://%s:5000" % SERVER
REGION = "eu-west-1"
TABLE = "batchq-results"
LOG = "/var/lib/batchq-moto/requests.jsonl"
# The consumer_control.yml runs of these tests act on the SQS consumer of its workers alone.
SQS_ONLY = ("-e", "consumer_hosts=sqs_workers", "-e", "consumer_names=sqs")
# A test key pair: moto takes any.
CREDENTIALS = "[default]\naws_access_key_id = fleet\naws_secret_access_key = fleet test secret\n"
# What the drain saw, for the tests that judge it.
FLEET = {}


def host(name):
    return testinfra.get_host("ansible://" + name, ansible_inventory=INVENTORY)


def aws(code, **values):
    """Run code (Python, with sqs, dynamodb and json at hand) on the server's host; its printed JSON."""
    prelude = ("import boto3, json\n"
               "keys = dict(endpoint_url=%r, region_name=%r, aws_access_key_id='fleet', aws_secret_access_key='x')\n"
               "sqs, dynamodb = boto3.client('sqs', **keys), boto3.client('dynamodb', **keys)\n"
               % (ENDPOINT, REGION))
    constants = "".join("%s = %r\n" % item for item in values.items())
    return json.loads(host(SERVER).check_output("python3 -c %s", prelude + constants + code))


def docker(*argv):
    return subprocess.run(["docker", *argv], check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120).stdout


def address_of(container):
    return docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container).strip()


def network_of(container):
    return docker("inspect", "-f", "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}}{{end}}",
                  container).strip()


def note_addresses(*names):
    """Which worker has which address from now on: a restart or a reconnect may change it."""
    now = time.time()
    for name in names:
        FLEET.setdefault("addresses", []).append((now, address_of(name), name))


def worker_of(client, when):
    """The worker that had address client at time when."""
    found = [(since, name) for since, address, name in FLEET["addresses"] if address == client and since <= when]
    assert found, "a request from %s, no worker's address at %.1f: %s" % (client, when, FLEET["addresses"])
    return max(found)[1]


def server_record(tail=None):
    """The server's record of its answers; the last tail lines only, if given (docker exec: fast)."""
    if tail:
        out = docker("exec", SERVER, "tail", "-n", str(tail), LOG)
    else:
        out = host(SERVER).check_output("cat %s", LOG)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def received_lately(name, since):
    """True when name was given messages after since, by the server's record."""
    return any(entry.get("action") == "ReceiveMessage" and entry["messages"] and entry["time"] > since
               and entry["client"] == address_of(name) for entry in server_record(tail=300))


def deploy_example(queue_url):
    """examples/sqs_queue/deploy.yml, as a user runs it: the example's consumer with the test's queue."""
    consumer = yaml.safe_load((EXAMPLE / "group_vars" / "consumers.yml").read_text())["consumer_list"][0]
    consumer.update(
        # 40 ms of work a job and batches of 100 (4 s and more): a batch is in flight when a fault strikes.
        # Three attempts 2-4 and 4-8 s apart: a poison job is dead within about 20 s. The example's
        # --max-seconds: no batch here comes near it, so none gives messages back unstarted.
        command=("/usr/local/bin/batchq-sqs --queue-url %s --endpoint-url %s --table-endpoint-url %s --region %s"
                 " --results-table %s --limit 100 --work-ms 40 --max-seconds 240 --job-timeout 20"
                 " --visibility-timeout %d --max-attempts %d --backoff-min 4 --backoff-max 8"
                 % (queue_url, ENDPOINT, ENDPOINT, REGION, TABLE, VISIBILITY, MAX_ATTEMPTS)),
        interval="5s")
    variables = {"consumer_list": [consumer], "sqs_aws_credentials": CREDENTIALS}
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as handle:
        yaml.safe_dump(variables, handle)
        handle.flush()
        process = subprocess.run(["ansible-playbook", str(EXAMPLE / "deploy.yml"), "-i", INVENTORY,
                                  "-e", "consumer_hosts=sqs_workers", "-e", "@" + handle.name],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900,
                                 check=False)
    assert process.returncode == 0, process.stdout


def queue_counts():
    return aws("attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=['All'])['Attributes']\n"
               "print(json.dumps([int(attributes[name]) for name in ('ApproximateNumberOfMessages',"
               " 'ApproximateNumberOfMessagesNotVisible', 'ApproximateNumberOfMessagesDelayed')]))",
               url=FLEET["queue"])


def dead_letters():
    """Every message of the dead-letter queue: (body, its batchq-* attributes), received once and left there."""
    return aws("found = {}\n"
               "for _ in range(20):\n"
               "    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600,"
               " MessageAttributeNames=['All']).get('Messages', [])\n"
               "    for m in got:\n"
               "        found[m['MessageId']] = [m['Body'], {k: v['StringValue'] for k, v in"
               " m.get('MessageAttributes', {}).items()}]\n"
               "    if not got:\n"
               "        break\n"
               "print(json.dumps(list(found.values())))", url=FLEET["dlq"])


def test_the_sqs_fleet_drains_through_faults():
    # The queue, its dead-letter queue and the results table, as the example's group_vars ask.
    FLEET["queue"], FLEET["dlq"] = aws(
        "dlq = sqs.create_queue(QueueName='batchq-dead')['QueueUrl']\n"
        "arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=['QueueArn'])['Attributes']['QueueArn']\n"
        "policy = json.dumps({'deadLetterTargetArn': arn, 'maxReceiveCount': str(receives)})\n"
        "url = sqs.create_queue(QueueName='batchq-jobs', Attributes={'RedrivePolicy': policy})['QueueUrl']\n"
        "dynamodb.create_table(TableName=table, KeySchema=[{'AttributeName': 'message_id', 'KeyType': 'HASH'}],"
        " AttributeDefinitions=[{'AttributeName': 'message_id', 'AttributeType': 'S'}],"
        " BillingMode='PAY_PER_REQUEST')\n"
        "print(json.dumps([url, dlq]))", receives=RECEIVES, table=TABLE)
    deploy_example(FLEET["queue"])
    note_addresses(*WORKERS)
    FLEET["server_address"] = address_of(SERVER)  # the test's own calls: no worker's

    # The jobs, sent by the example's tool from a worker with the same keys.
    sender = host(WORKERS[-1])
    sender.check_output("mkdir -p /root/fleet-keys && printf %s > /root/fleet-keys/aws", CREDENTIALS)
    out = sender.check_output("CREDENTIALS_DIRECTORY=/root/fleet-keys batchq-sqs-enqueue %s --queue-url %s "
                              "--endpoint-url %s --region %s --crashing %s --raising %s", str(JOBS),
                              FLEET["queue"], ENDPOINT, REGION, str(CRASHING), str(RAISING))
    assert json.loads(out) == {"sent": JOBS}, out
    FLEET["start"] = time.time()
    code, output = control("run", *SQS_ONLY)  # the consumers would poll again after their interval
    assert code == 0, output

    # One worker dies in the middle of a batch: its last receive was a moment ago, a batch takes 4 s and more.
    # (The first batches may have claimed while the jobs were sent: the next claim comes within minutes.)
    wait_for(lambda: received_lately(KILLED, time.time() - 2.0), 240, "a batch of %s to claim" % KILLED,
             interval=0.1)
    docker("kill", KILLED)
    FLEET["killed_at"] = time.time()
    # Another loses the network while a batch of it holds messages.
    wait_for(lambda: received_lately(CUT, time.time() - 2.0), 240, "a batch of %s to claim" % CUT, interval=0.1)
    network = network_of(CUT)
    docker("network", "disconnect", network, CUT)
    FLEET["cut_at"] = time.time()
    docker("start", KILLED)
    note_addresses(KILLED)  # before its systemd starts any batch
    host(KILLED).check_output("systemctl is-system-running --wait || true")
    # The cut lasts as long as the test says: the time itself is what is tested.
    time.sleep(max(0.0, FLEET["cut_at"] + CUT_SECONDS - time.time()))
    docker("network", "connect", network, CUT)
    note_addresses(CUT)
    FLEET["reconnected_at"] = time.time()

    # Drained: nothing left in the queue, the poison jobs in the dead-letter queue.
    wait_for(lambda: queue_counts() == [0, 0, 0], 300, "the queue to drain", interval=2)
    FLEET["drained_at"] = time.time()
    code, output = control("pause", *SQS_ONLY)
    assert code == 0, output
    FLEET["record"] = server_record()
    FLEET["results"] = aws(
        "items, start = {}, {}\n"
        "while True:\n"
        "    page = dynamodb.scan(TableName=table, ConsistentRead=True, **start)\n"
        "    items.update((i['message_id']['S'], i['result']['S']) for i in page['Items'])\n"
        "    if 'LastEvaluatedKey' not in page:\n"
        "        break\n"
        "    start = {'ExclusiveStartKey': page['LastEvaluatedKey']}\n"
        "print(json.dumps(items))", table=TABLE)
    FLEET["dead"] = dead_letters()
    figure("fleet on SQS: %d jobs drained in %.0f s by three workers through a kill and a %d s cut"
           % (JOBS, FLEET["drained_at"] - FLEET["start"], CUT_SECONDS))


def deliveries():
    """{message id: [(time, worker, body, receive count)]} of every delivery, oldest first."""
    found = {}
    for entry in FLEET["record"]:
        assert "unreadable" not in entry, entry
        if entry["action"] != "ReceiveMessage" or entry["client"] == FLEET["server_address"]:
            continue
        who = worker_of(entry["client"], entry["time"])
        for key, body, count in entry["messages"]:
            found.setdefault(key, []).append((entry["time"], who, body, count))
    return found


def poison(body):
    payload = json.loads(body)
    return "crash" if payload.get("crash") else "raise" if payload.get("raise") else None


def test_nothing_is_lost():
    delivered = deliveries()
    bodies = {key: runs[0][2] for key, runs in delivered.items()}
    # every job sent was delivered: job n's body is {"n": n}, with its fault if it has one
    assert sorted(json.loads(body)["n"] for body in bodies.values()) == list(range(1, JOBS + 1))
    good = {key for key, body in bodies.items() if not poison(body)}
    assert len(good) == JOBS - POISON
    assert set(FLEET["results"]) == good
    assert {attributes["batchq-message-id"] for _body, attributes in FLEET["dead"]} == set(bodies) - good


def test_each_result_is_stored_once_and_is_the_one_expected():
    delivered = deliveries()
    # the stand-in's result, computed here from the body the server delivered
    for key, result in FLEET["results"].items():
        assert json.loads(result) == {"job": key, "bytes": len(delivered[key][0][2])}, (key, result)
    # A result is stored by a conditional put: one succeeded for each job, whatever the deliveries.
    stored = {}
    for entry in FLEET["record"]:
        if entry["action"] == "PutItem" and entry["status"] == 200:
            stored[entry["key"]] = stored.get(entry["key"], 0) + 1
    assert stored == {key: 1 for key in FLEET["results"]}
    refused = [entry for entry in FLEET["record"] if entry["action"] == "PutItem" and entry["status"] != 200]
    assert all(entry["status"] == 400 for entry in refused), refused[:5]
    figure("fleet on SQS: %d results stored once each; %d second puts refused by their condition"
           % (len(stored), len(refused)))


def lost(delivery):
    """True when a delivery went to a batch that the kill or the cut ended."""
    when, who = delivery[0], delivery[1]
    if who == KILLED:
        return when < FLEET["killed_at"]
    return who == CUT and FLEET["cut_at"] - BATCH_SECONDS < when < FLEET["reconnected_at"]


def test_a_job_is_delivered_again_only_after_a_lost_batch_held_it():
    delivered = deliveries()
    again = {"killed": 0, "cut": 0}
    for key, runs in delivered.items():
        if poison(runs[0][2]):
            continue
        # SQS counts every receive, and says so
        assert [run[3] for run in runs] == list(range(1, len(runs) + 1)), runs
        for earlier in runs[:-1]:
            assert lost(earlier), "%s delivered again after a batch that was not lost: %s" % (key, runs)
            again["killed" if earlier[1] == KILLED else "cut"] += 1
    assert again["killed"] > 0, "no message of %s's batch was delivered again: the kill missed the batch" % KILLED
    assert again["cut"] > 0, "no message of %s's batch was delivered again: the cut missed the batch" % CUT
    figure("fleet on SQS: %d messages of the killed batch and %d of the cut-off one were delivered again"
           % (again["killed"], again["cut"]))


def test_poison_jobs_end_in_the_dead_letter_queue_after_their_attempts():
    delivered = deliveries()
    copies = {}
    for body, attributes in FLEET["dead"]:
        copies.setdefault(attributes["batchq-message-id"], []).append((body, attributes))
    kinds = {}
    for key, found in copies.items():
        runs = delivered[key]
        kind = poison(runs[0][2])
        kinds[kind] = kinds.get(kind, 0) + 1
        error = {"crash": "killed by SIGSEGV", "raise": "ValueError: job payload asks to raise"}[kind]
        held_by_lost = [run for run in runs if lost(run)]
        if not held_by_lost:
            # its attempts, each a delivery, and one copy in the dead-letter queue from the last
            assert len(runs) == MAX_ATTEMPTS, runs
            assert len(found) == 1, found
        for body, attributes in found:
            assert body == runs[0][2]
            # a copy comes from a delivery at or past the last attempt
            assert int(attributes["batchq-attempts"]) in [run[3] for run in runs if run[3] >= MAX_ATTEMPTS], (
                attributes, runs)
            assert error in attributes["batchq-error"] or "attempts ran out" in attributes["batchq-error"], attributes
        # A second copy only when a lost batch moved it and died before its delete: the next delivery
        # found its attempts spent and moved it again.
        moved = [run for run in runs if run[3] >= MAX_ATTEMPTS]
        assert all(lost(run) for run in moved[:-1]), (found, runs)
        assert len([run for run in moved if not lost(run)]) <= len(found) <= len(moved), (found, runs)
    assert kinds == {"crash": CRASHING, "raise": RAISING}
    figure("fleet on SQS: %d poison jobs in the dead-letter queue, %d copies"
           % (len(copies), len(FLEET["dead"])))


def test_the_drain_never_stalled():
    stored = sorted(entry["time"] for entry in FLEET["record"]
                    if entry["action"] == "PutItem" and entry["status"] == 200)
    gaps = [(later - earlier, earlier - FLEET["start"]) for earlier, later in zip(stored, stored[1:])]
    longest = max(gaps)
    events = {key: round(value - FLEET["start"], 1) for key, value in FLEET.items() if key.endswith("_at")}
    assert longest[0] <= STALL_SECONDS, "no result stored for %.1f s from %.1f s into the drain; %s" % (
        longest + (events,))
    figure("fleet on SQS: the longest wait between two results stored was %.1f s, faults included" % longest[0])
