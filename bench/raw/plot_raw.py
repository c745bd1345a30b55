#!/usr/bin/python3
"""Plots `kvrail bench raw --json` rows: bandwidth and the ratio to ucx_perftest.

    bazel-bin/tools/kvrail bench raw --json > rows.json
    /usr/bin/python3 bench/raw/plot_raw.py rows.json -o raw.png

One column per link (verbs rows: per provider). Rows with "bandwidth_claim": false (the
software verbs provider, softverbs: a functional run, never a bandwidth) are left out. Top row: GB/s against block size, kvrail solid and ucx_perftest
dashed, one colour per batch size, memcpy of kvrail's working set dotted grey (one thread in
rows from before 2026-12-02, as many as kvrail's lanes since: memcpy_threads).
Bottom row: kvrail / ucx_perftest per batch size, with the 1.0 line the issue's target sits on;
dotted, the bench's explaining columns: over tcp, ucx_perftest given kvrail's segment sizes
(tuned), and over shared memory, kvrail rewriting one block as ucx_perftest does (1blk).
"""

import argparse
import json
import sys

REQUIRED = ("link", "block_bytes", "batch", "gbps")


def load_rows(text, source):
    """The rows of `kvrail bench raw --json`; ValueError naming `source` and what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f'{source}: expected {{"rows": [...]}} from kvrail bench raw --json')
    rows = data["rows"]
    if not rows:
        raise ValueError(f"{source}: no rows to plot")
    for row in rows:  # files written before 2026-12-04 call the link "transport"
        if isinstance(row, dict) and "transport" in row:
            row.setdefault("link", row.pop("transport"))
    for i, row in enumerate(rows):
        missing = [key for key in REQUIRED if not isinstance(row, dict) or key not in row]
        if missing:
            raise ValueError(f"{source}: row {i} lacks {', '.join(missing)}")
        if not isinstance(row["block_bytes"], int) or row["block_bytes"] <= 0:
            raise ValueError(f"{source}: row {i}: block_bytes must be a positive integer")
    claimed = [row for row in rows if row.get("bandwidth_claim", True) is not False]
    if not claimed:
        raise ValueError(f"{source}: no rows to plot: every row makes no bandwidth claim "
                         "(the software verbs provider)")
    if len(claimed) < len(rows):
        print(f"plot_raw: left out {len(rows) - len(claimed)} rows without a bandwidth claim "
              "(the software verbs provider)", file=sys.stderr)
    for row in claimed:
        if row.get("provider"):
            row["link"] = f'{row["link"]}({row["provider"]})'
    return claimed


def size_label(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def plot(rows, output, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    plain = FuncFormatter(lambda v, _: f"{v:g}")

    links = list(dict.fromkeys(row["link"] for row in rows))
    batches = sorted({row["batch"] for row in rows})
    blocks = sorted({row["block_bytes"] for row in rows})
    colours = plt.get_cmap("viridis")
    colour = {b: colours(i / max(1, len(batches) - 1) * 0.85) for i, b in enumerate(batches)}

    fig, axes = plt.subplots(2, len(links), figsize=(5.2 * len(links), 7.5),
                             squeeze=False, sharex=True)
    for column, link in enumerate(links):
        top, bottom = axes[0][column], axes[1][column]
        mine = [row for row in rows if row["link"] == link]
        for batch in batches:
            series = sorted((r for r in mine if r["batch"] == batch),
                            key=lambda r: r["block_bytes"])
            if not series:
                continue
            x = [r["block_bytes"] for r in series]
            top.plot(x, [r["gbps"] for r in series], "o-", color=colour[batch],
                     label=f"kvrail, batch {batch}")
            peer = [(r["block_bytes"], r.get("peer_gbps")) for r in series
                    if r.get("peer_gbps")]
            if peer:
                top.plot(*zip(*peer), "s--", color=colour[batch], alpha=0.6, markersize=4,
                         label=f"ucx_perftest, batch {batch}")
            ratio = [(r["block_bytes"], r.get("ratio")) for r in series if r.get("ratio")]
            if ratio:
                bottom.plot(*zip(*ratio), "o-", color=colour[batch], label=f"batch {batch}")
            tuned = [(r["block_bytes"], r.get("tuned_ratio")) for r in series
                     if r.get("tuned_ratio")]
            if tuned:
                bottom.plot(*zip(*tuned), "x:", color=colour[batch], alpha=0.7,
                            label=f"batch {batch}, vs ucx_perftest with kvrail's tcp segments")
            one_block = [(r["block_bytes"], r.get("one_block_ratio")) for r in series
                         if r.get("one_block_ratio")]
            if one_block:
                bottom.plot(*zip(*one_block), "^:", color=colour[batch], alpha=0.7,
                            label=f"batch {batch}, one block (1blk)")
        memcpy = {}
        for r in mine:
            if r.get("memcpy_gbps") and r["batch"] == batches[0]:
                memcpy[r["block_bytes"]] = r["memcpy_gbps"]
        if memcpy:
            x = sorted(memcpy)
            top.plot(x, [memcpy[b] for b in x], ":", color="grey",
                     label=f"memcpy, one thread (batch {batches[0]})")
        top.set_title(link)
        top.set_yscale("log")
        top.set_ylabel("GB/s (decimal)")
        top.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        top.yaxis.set_major_formatter(plain)
        top.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        top.grid(True, which="both", alpha=0.3)
        top.legend(fontsize=7, framealpha=0.7)
        bottom.axhline(1.0, color="black", linewidth=1)
        bottom.set_yscale("log", base=2)
        bottom.yaxis.set_major_formatter(plain)
        bottom.set_ylabel("kvrail / ucx_perftest (above 1: kvrail faster)")
        bottom.set_xlabel("block size")
        bottom.grid(True, which="both", alpha=0.3)
        if bottom.get_legend_handles_labels()[0]:
            bottom.legend(fontsize=7, framealpha=0.7)
        bottom.set_xscale("log", base=2)
        bottom.set_xticks(blocks)
        bottom.set_xticklabels([size_label(b) for b in blocks])
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(output, dpi=110)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", help="kvrail bench raw --json output ('-' for stdin)")
    parser.add_argument("-o", "--output", default="raw.png", help="image to write (.png, .svg)")
    parser.add_argument("--title", default="kvrail bench raw: one-sided writes between two "
                        "processes")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.rows == "-" else open(args.rows).read()
        rows = load_rows(text, "stdin" if args.rows == "-" else args.rows)
    except (OSError, ValueError) as e:
        print(f"plot_raw: {e}", file=sys.stderr)
        return 2
    plot(rows, args.output, args.title)
    print(f"plot_raw: wrote {args.output} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
