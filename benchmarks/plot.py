"""Draws the markdown tables that benchmarks/fleet.sh and benchmarks/drain.sh print.

Usage: plot.py fleet|drain TABLE.md OUT.png [TITLE]
  fleet: a table whose first column is the number of instances and whose other
         columns named "... jobs/s" or "with preload" hold jobs/s: one line each,
         throughput against instances; the columns named "... / daemons" in a
         second panel, the ratio against instances, with the target of 0.9 as a
         dashed line. A cell "median (min-max)" draws its range as an error bar;
         a cell with one number (the tables of benchmarks/figures/ hold medians
         only) draws the point alone.
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


# The share of the daemons' throughput the consumers aim at (the performance guide).
TARGET_RATIO = 0.9


def point(x, cell):
    """(x, median, low, high) of a cell "median (min-max)", or of one number (no spread)."""
    values = numbers(cell)
    low, high = (values[1], values[2]) if len(values) >= 3 else (values[0], values[0])
    return (x, values[0], low, high)


def fleet_series(text):
    """({label: [(instances, jobs/s, low, high)]}, {label: [(instances, ratio, low, high)]}) of a fleet table."""
    header, rows = table(text)
    throughput, ratios = {}, {}
    for i, name in enumerate(header):
        name = plain(name)
        if not i:
            continue
        if name.endswith("/ daemons"):
            target, label = ratios, name.replace(" / daemons", "").replace("with ", "consumers with ")
        elif "/" not in name.replace("jobs/s", "") and ("jobs/s" in name or "preload" in name):
            target, label = throughput, name.replace(" jobs/s", "")
            label = "consumers " + label if label.startswith("with ") else label
        else:
            continue
        target[label] = [point(numbers(row[0])[0], row[i]) for row in rows if row[i].strip()]
    return throughput, ratios


def draw_points(axes, points, **style):
    """A line through the medians, with each point's range as an error bar where it has one."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    errors = [[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]]
    if any(e for side in errors for e in side):
        axes.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, **style)
    else:
        axes.plot(xs, ys, marker="o", **style)


def drain_series(text):
    """{release: {label: [(B, median, low, high)]}} of a drain table."""
    header, rows = table(text)
    panels = {}
    for row in rows:
        release = plain(row[0])
        batch = numbers(row[1])[0]
        for i in range(2, len(header)):
            if not numbers(row[i]):
                continue
            panels.setdefault(release, {}).setdefault(plain(header[i]), []).append(point(batch, row[i]))
    return panels


def draw(kind, text, out, title=None):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    if kind == "fleet":
        throughput, ratios = fleet_series(text)
        figure, all_axes = pyplot.subplots(1, 2, figsize=(10, 4), dpi=100, squeeze=False)
        axes, ratio_axes = all_axes[0]
        colours = {}
        for label, points in throughput.items():
            draw_points(axes, points, label=label)
            colours[label] = axes.get_lines()[-1].get_color()
        axes.set_xlabel("instances")
        axes.set_ylabel("jobs/s")
        axes.set_ylim(bottom=0)
        axes.set_title("throughput", fontsize="medium")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
        # a ratio takes the colour of the consumers' line it divides
        for label, points in ratios.items():
            draw_points(ratio_axes, points, label=label + " / daemons", color=colours.get(label))
        ratio_axes.axhline(TARGET_RATIO, color="black", linestyle="--", linewidth=1,
                           label="target %.1f" % TARGET_RATIO)
        ratio_axes.set_xlabel("instances")
        ratio_axes.set_ylabel("consumers' jobs/s ÷ daemons'")
        ratio_axes.set_ylim(0, 1.05)
        spread = any(p[2] != p[3] for points in list(throughput.values()) + list(ratios.values()) for p in points)
        ratio_axes.set_title("consumers / daemons" + ("" if spread else " (medians, no range given)"),
                             fontsize="medium")
        ratio_axes.grid(True, alpha=0.3)
        ratio_axes.legend(fontsize="small", loc="lower left")
    else:
        panels = drain_series(text)
        figure, all_axes = pyplot.subplots(1, len(panels), figsize=(3.6 * len(panels) + 0.6, 4), dpi=100,
                                           sharey=True, squeeze=False)
        for axes, (release, series) in zip(all_axes[0], panels.items()):
            for label, points in series.items():
                draw_points(axes, points, label=label)
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
