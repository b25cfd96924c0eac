"""consumer_units' reading of which stopped consumers still run a batch, from
`systemctl show` output. The SubStates of batchq-slow1 (its batch runs) and
batchq-slow2 (it waits for a slot) are those systemd 247 gave on Debian 11
under a consumer_budget with running_max 1; the others are made up, batchq-queued
as systemd 258 and later keep a start that waits for a slot (a queued start job)."""

from ansible_collections.batchq.consumers.plugins.modules import consumer_units

SHOWN = """Id=batchq-slow1.service
ActiveState=activating
SubState=start

Id=batchq-slow2.service
ActiveState=activating
SubState=start-pre

Id=batchq-idle.service
ActiveState=inactive
SubState=dead

Id=batchq-ending.service
ActiveState=deactivating
SubState=stop-post

Id=batchq-queued.service
ActiveState=inactive
SubState=dead
Job=1234
"""


class Host:
    """What starts_now() asks of a module: a systemctl, and its output."""
    def __init__(self, out):
        self.out, self.asked = out, []

    def get_bin_path(self, name, required=False):
        return "/usr/bin/" + name

    def run_command(self, argv, **kwargs):
        self.asked.append(argv)
        return 0, self.out, ""


def test_a_start_that_waits_before_its_batch_is_told_from_a_batch_that_runs():
    services = ["batchq-slow1.service", "batchq-slow2.service", "batchq-idle.service", "batchq-ending.service",
                "batchq-queued.service"]
    host = Host(SHOWN)
    assert consumer_units.starts_now(host, services) == (["batchq-slow1.service"],
                                                         ["batchq-slow2.service", "batchq-queued.service"])
    assert host.asked[0][1:4] == ["show", "--property=Id,ActiveState,SubState,Job", "--"]


def test_no_service_asks_nothing():
    host = Host("")
    assert consumer_units.starts_now(host, []) == ([], [])
    assert host.asked == []
