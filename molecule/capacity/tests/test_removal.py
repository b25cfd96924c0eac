"""Removing every consumer leaves nothing of the budget or of the ranges of
instances behind. Runs last (its file's name): the hosts have no consumer after it."""

from testlib import assert_deployed, deploy


def test_removing_every_consumer_leaves_no_slice_no_slot_no_scaler_and_no_helper(hosts):
    assert_deployed(deploy([], consumer_exclusive=True))
    for host in hosts:
        left = host.run("ls -d /usr/local/lib/batchq /etc/systemd/system/batchq.slice /etc/systemd/system/batchq-* "
                        "/etc/systemd/system/batchq.scale@.service /etc/systemd/system/*/batchq-* /run/batchq "
                        "/var/lib/prometheus/node-exporter/batchq-* 2>/dev/null").stdout
        assert left == "", (host.backend.get_hostname(), left)
        # the path unit of the range is stopped too
        assert host.run("systemctl is-active batchq-elastic.path").stdout.strip() != "active"
