"""Prints the tables of benchmarks/drain.sh from its raw records.

Usage: python3 table.py STARTS RESULTS ITEMS
STARTS: "RELEASE<tab>versions<tab>TEXT", "RELEASE<tab>load<tab>LOADAVG" and
"RELEASE<tab>start<tab>WHAT<tab>MS" lines.
RESULTS: "RELEASE VARIANT B ROUND SECONDS BATCHES ITEMS [SPAN]" lines; for (d)
the seconds of 5 consecutive batch periods, for the others of one whole drain,
and SPAN the seconds from its first batch's start to its last batch's end.
"""

import statistics
import sys
from collections import defaultdict

WORK_MS = 1.0
VARIANTS = {
    "a": "(a) backlog_exit_code",
    "b": "(b) Type=simple daemon",
    "c": "(c) shell loop, no systemd",
    "w": "(w) batchq-drain by hand",
    "p": "(p) Python, preload",
    "n": "(n) Python, no preload",
    "d": "(d) interval 1s, no backlog",
}


def spread(values, fmt):
    """Median (min-max) of values, each formatted with fmt."""
    return "%s (%s-%s)" % (fmt % statistics.median(values), fmt % min(values), fmt % max(values))


def ratio(values):
    """Ratios to 1/1000 near 1, where the targets are; whole numbers far from it."""
    return spread(values, "%.3f" if max(values) < 10 else "%.0f") if values else ""


def main(starts_path, results_path, drain_items):
    drain_items = int(drain_items)
    versions, starts, loads = {}, defaultdict(list), defaultdict(list)
    with open(starts_path) as starts_file:
        for line in starts_file:
            fields = line.rstrip("\n").split("\t")
            if fields[1] == "versions":
                versions[fields[0]] = fields[2]
            elif fields[1] == "load":
                loads[fields[0]].append(fields[2])
            else:
                starts[fields[0]].append((fields[2], float(fields[3])))
    runs = defaultdict(dict)
    with open(results_path) as results_file:
        for line in results_file:
            release, variant, batch, round_, seconds, batches, items, *span = line.split()
            runs[release, int(batch)][variant, int(round_)] = (
                float(seconds), int(batches), int(items), float(span[0]) if span else None)

    for release in sorted(versions):
        print("Debian %s (%s), N = %d items, 1 ms of busy CPU per item" % (release, versions[release], drain_items))
        print("  load average of the machine (1, 5, 15 min) before and after: %s" % "; ".join(loads[release]))
        for what, ms in starts[release]:
            print("  start of %s: %.2f ms (fork+exec+exit from a bash loop, mean)" % (what, ms))
        head = ("variant", "B", "drain s", "items/s", "ms/batch beyond work", "the same after the first batch",
                "÷ (b)", "÷ (c)")
        rows = [head]
        for batch in sorted(b for r, b in runs if r == release):
            table = runs[release, batch]
            for variant in VARIANTS:
                rounds = sorted(r for v, r in table if v == variant)
                if not rounds:
                    continue
                drain, rate, extra, later, over_b, over_c = [], [], [], [], [], []
                for round_ in rounds:
                    seconds, batches, items, span = table[variant, round_]
                    rate.append(items / seconds)
                    extra.append((seconds * 1000 - items * WORK_MS) / batches)
                    if span is not None and batches > 1:
                        # what each batch after the first costs: the run's start and the first batch's start left out
                        later.append((span * 1000 - items * WORK_MS) / (batches - 1))
                    # (d) timed 5 batches: its drain time is that rate over N items.
                    drain.append(seconds * drain_items / items)
                    for base, ratios in (("b", over_b), ("c", over_c)):
                        if (base, round_) in table and variant != base:
                            base_seconds, base_items = table[base, round_][0], table[base, round_][2]
                            ratios.append((seconds / items) / (base_seconds / base_items))
                rows.append((
                    VARIANTS[variant] + (" *" if variant == "d" else ""), str(batch),
                    spread(drain, "%.2f"), "%.0f" % statistics.median(rate), spread(extra, "%.2f"),
                    spread(later, "%.2f") if later else "",
                    ratio(over_b), ratio(over_c),
                ))
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        for number, row in enumerate(rows):
            print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
            if number == 0:
                print("  " + "  ".join("-" * width for width in widths))
        print("  median (min-max) over %d rounds; ratios are drain time per item over the same round's (b) or (c)."
              % max(r for unused, r in runs[release, batch]))
        print("  * (d): 5 batches per round timed from the consumer's own start times, drain time extrapolated to N.")
        print()

    # The same figure as markdown, what benchmarks/plot.py draws: ms a batch beyond its work after the
    # first batch of the run (its start left out), by release and B, a column per variant timed so.
    timed = [v for v in VARIANTS if any(v == variant and table[variant, r][3] is not None
                                        for table in runs.values() for variant, r in table)]
    print("ms a batch beyond its work, after the first batch of the run; median (min-max) of the rounds")
    print("| Debian | B | " + " | ".join(VARIANTS[v] for v in timed) + " |")
    print("| --- | --- | " + " | ".join("---" for variant in timed) + " |")
    for release, batch in sorted(runs):
        table = runs[release, batch]
        cells = []
        for variant in timed:
            later = [(span * 1000 - items * WORK_MS) / (batches - 1)
                     for (v, r), (seconds, batches, items, span) in sorted(table.items())
                     if v == variant and span is not None and batches > 1]
            cells.append(spread(later, "%.2f") if later else "")
        print("| %s (%s) | %d | %s |" % (release, versions.get(release, ""), batch, " | ".join(cells)))


if __name__ == "__main__":
    main(*sys.argv[1:])
