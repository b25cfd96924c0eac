# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The files of the consumers' Prometheus metrics that the role lays out.

Each consumer's textfile <dir>/<prefix><name>.prom links to
<prefix><name>.d/metrics.prom: a folder of the consumer's own user, so that a
drain can write it after each batch from inside its sandbox, atomically
(rename), while the folder node_exporter reads stays root's. The counters live
in that file: an existing one is never overwritten, and until the first batch
it is empty (a link to nothing would be a scrape error).

<prefix><name>.paused.prom holds batchq_consumer_paused, 1 while the consumer
is paused on purpose, for the alert rules: a file of its own, which no batch
writes. Consumer names have no dot, so no consumer's file is called so.
<prefix><name>.scale.prom holds batchq_consumer_active_instances of a consumer
whose instances are a range: root's too, written by batchq_scale.py.
"""

from __future__ import annotations

__metaclass__ = type

PAUSED_HELP = ("# HELP batchq_consumer_paused 1 while the consumer is paused "
               "(state: paused, or consumer_control.yml pause).\n"
               "# TYPE batchq_consumer_paused gauge\n")


def paused_text(name, paused):
    return PAUSED_HELP + 'batchq_consumer_paused{consumer="%s"} %d\n' % (name, 1 if paused else 0)


def metrics_files(consumers, folder, prefix, enabled=True, paused=None, only_paused=False):
    """The entries of the consumer_files module for consumers (the role's
    normalised ones: name, user, group, state): what metrics need, or with
    enabled false what must go (then names will do: a removed consumer's). paused overrides each consumer's own state
    (consumer_control.yml); only_paused leaves out all but the paused files. folder None: each consumer's own
    metrics_dir, as consumer_deployed found it, and none for a consumer without one."""
    entries = []
    for consumer in consumers:
        consumer = consumer if isinstance(consumer, dict) else {"name": consumer}
        where = consumer.get("metrics_dir") if folder is None else folder
        if not where:
            continue
        stem = "%s/%s%s" % (where, prefix, consumer["name"])
        is_paused = consumer.get("state") == "paused" if paused is None else bool(paused)
        paused_file = {"path": stem + ".paused.prom", "state": "file", "mode": "0644",
                       "content": paused_text(consumer["name"], is_paused)}
        if only_paused:
            entries.append(paused_file)
        elif not enabled:
            entries += [{"path": stem + suffix, "state": "absent"}
                        for suffix in (".prom", ".paused.prom", ".scale.prom", ".d")]
        else:
            owner = {"owner": consumer["user"], "group": consumer["group"]}
            entries += [
                dict(owner, path=stem + ".d", state="directory", mode="0755"),
                dict(owner, path=stem + ".d/metrics.prom", state="file", mode="0644", content="", force=False),
                {"path": stem + ".prom", "state": "link", "src": "%s%s.d/metrics.prom" % (prefix, consumer["name"])},
                paused_file,
            ]
            if not consumer.get("scale"):  # its instances are no longer a range
                entries.append({"path": stem + ".scale.prom", "state": "absent"})
    return entries
