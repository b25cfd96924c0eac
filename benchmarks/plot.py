"""Draws the markdown tables that benchmarks/fleet.sh and benchmarks/drain.sh print.

Usage: plot.py fleet|drain TABLE.md OUT.png [TITLE]
  fleet: a table whose first column is the number of instances and whose other
         columns named "... jobs/s" or "with preload" hold jobs/s: one line each,
         throughput against instances (ratio columns are left out).
  drain: a table whose first column names the Debian release, whose second is
         the batch size B and whose other columns hold ms a batch costs beyond
         its work, "median (min-max)": cost per batch against B, a line per
         column, a panel per Debian release, the range as error bars.
Lines of the file that are not part of a markdown table are ignored, so the
whole output of a benchmark can be given. The two scripts call this with the
docs venv's Python (matplotlib from requirements/docs.txt) when BENCH_PLOT_DIR
is not empty; benchmarks/figures/ keeps the tables the published pictures of
docs/docsite/rst/images/ were drawn from.
"""

import re
import sys

# Unsigned: a range "5.73-7.67" is two numbers, not a negative one.
NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def table(text):
    """The first markdown table of text: (header, rows), each a list of cells."""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    rows = [row for row in rows if not all(re.fullmatch(r":?-+:?", cell) for cell in row)]
    if len(rows) < 2:
        raise ValueError("no markdown table with a header and a row")
    return rows[0], rows[1:]


def plain(cell):
    """A cell without markdown emphasis or code marks."""
    return cell.replace("**", "").replace("`", "").strip()


def numbers(cell):
    """The numbers of a cell: "5.85 (5.73-7.67)" gives [5.85, 5.73, 7.67]."""
    return [float(value) for value in NUMBER.findall(plain(cell).replace("–", " "))]


def fleet_series(text):
    """{label: [(instances, jobs/s)]} of a fleet table."""
    header, rows = table(text)
    columns = [i for i, name in enumerate(header)
               if i and "/" not in plain(name).replace("jobs/s", "") and
               ("jobs/s" in name or "preload" in name)]
    series = {}
    for i in columns:
        label = plain(header[i]).replace(" jobs/s", "")
        label = "consumers " + label if label.startswith("with ") else label
        series[label] = [(numbers(row[0])[0], numbers(row[i])[0]) for row in rows if row[i].strip()]
    return series


def drain_series(text):
    """{release: {label: [(B, median, low, high)]}} of a drain table."""
    header, rows = table(text)
    panels = {}
    for row in rows:
        release = plain(row[0])
        batch = numbers(row[1])[0]
        for i in range(2, len(header)):
            values = numbers(row[i])
            if not values:
                continue
            median = values[0]
            low, high = (values[1], values[2]) if len(values) >= 3 else (median, median)
            panels.setdefault(release, {}).setdefault(plain(header[i]), []).append((batch, median, low, high))
    return panels


def draw(kind, text, out, title=None):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    if kind == "fleet":
        figure, axes = pyplot.subplots(figsize=(6, 3.6), dpi=100)
        for label, points in fleet_series(text).items():
            axes.plot([x for x, _y in points], [y for _x, y in points], marker="o", label=label)
        axes.set_xlabel("instances")
        axes.set_ylabel("jobs/s")
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
    else:
        panels = drain_series(text)
        figure, all_axes = pyplot.subplots(1, len(panels), figsize=(3.6 * len(panels) + 0.6, 4), dpi=100,
                                           sharey=True, squeeze=False)
        for axes, (release, series) in zip(all_axes[0], panels.items()):
            for label, points in series.items():
                xs = [p[0] for p in points]
                ys = [p[1] for p in points]
                errors = [[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]]
                axes.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=label)
            axes.set_xscale("log")
            axes.set_xticks(sorted({p[0] for s in series.values() for p in s}))
            axes.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            axes.set_xlabel("batch size B")
            axes.set_title("Debian " + release, fontsize="medium")
            axes.grid(True, alpha=0.3)
        # once every panel is drawn: the shared axis then spans all of them
        all_axes[0][0].set_ylim(bottom=0)
        all_axes[0][0].set_ylabel("ms a batch beyond its work")
        handles, labels = all_axes[0][0].get_legend_handles_labels()
        figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize="small", frameon=False)
    if title:
        figure.suptitle(title, fontsize="medium")
    figure.tight_layout(rect=(0, 0.08 if kind == "drain" else 0, 1, 1))
    figure.savefig(out, metadata={"Software": None})
    pyplot.close(figure)


def main(argv):
    if len(argv) not in (4, 5) or argv[1] not in ("fleet", "drain"):
        sys.exit(__doc__.split("\n\n")[1])
    with open(argv[2]) as source:
        text = source.read()
    draw(argv[1], text, argv[3], argv[4] if len(argv) == 5 else None)
    print("plot: wrote %s" % argv[3])


if __name__ == "__main__":
    main(sys.argv)
