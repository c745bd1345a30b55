#!/usr/bin/python3
"""Plots `kvrail bench kv --json`: GB/s against prompt length, one panel per link.

    bazel-bin/tools/kvrail bench kv --json > kv.json
    /usr/bin/python3 bench/kv/plot_kv.py kv.json -o kv.png

(`kvrail bench kv --plot kv.png` runs this script itself.) In each panel: one solid line per
(shape, prefill TP:decode TP) of the model-shaped rooms; dashed black, the contiguous rooms of
the same bytes (the efficiency's denominators), one line per room size in bytes per token, each
point the mean of the baselines of the cases of that size; dotted, the naive rows (--naive: one
write per row per page per field, never merged); and dotted grey, single-thread memcpy on the
same machine (the limit one copy per byte can reach).
"""

import argparse
import json
import sys

REQUIRED = ("shape", "prefill_tp", "decode_tp", "tokens", "link", "mode", "gbps")


def load_cases(text, source):
    """The cases of `kvrail bench kv --json`; ValueError naming `source` and what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise ValueError(f'{source}: expected {{"cases": [...]}} from kvrail bench kv --json')
    cases = data["cases"]
    if not cases:
        raise ValueError(f"{source}: no cases to plot")
    for case in cases:  # files written before 2026-12-04 call the link "transport"
        if isinstance(case, dict) and "transport" in case:
            case.setdefault("link", case.pop("transport"))
    for i, case in enumerate(cases):
        missing = [key for key in REQUIRED if not isinstance(case, dict) or key not in case]
        if missing:
            raise ValueError(f"{source}: case {i} lacks {', '.join(missing)}")
        if not isinstance(case["tokens"], int) or case["tokens"] <= 0:
            raise ValueError(f"{source}: case {i}: tokens must be a positive integer")
    return cases, data.get("memcpy_gbps")


def plot(cases, memcpy_gbps, output, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links = list(dict.fromkeys(c["link"] for c in cases))
    fig, axes = plt.subplots(1, len(links), figsize=(5.5 * len(links), 4.2),
                             squeeze=False, sharey=True)
    for column, link in enumerate(links):
        ax = axes[0][column]
        mine = [c for c in cases if c["link"] == link]
        series = {}
        for c in mine:
            if c["mode"] == "contiguous":
                # One baseline per room size: the rooms of one bytes-per-token share it.
                key = ("contiguous", c["bytes"] // c["tokens"])
            elif c["mode"] == "naive":
                key = (f'{c["shape"]} naive', f'{c["prefill_tp"]}:{c["decode_tp"]}')
            elif c["mode"] != "model":
                continue  # digest, unpopulated, layerwise: the table and JSON carry them
            else:
                key = (c["shape"], f'{c["prefill_tp"]}:{c["decode_tp"]}')
            series.setdefault(key, {}).setdefault(c["tokens"], []).append(c["gbps"])
        markers = iter("sDv^<>phx+")
        for (shape, tp), points in series.items():
            x = sorted(points)
            # Each case has its own baseline: a contiguous point is the mean of those.
            y = [sum(points[t]) / len(points[t]) for t in x]
            if shape == "contiguous":
                ax.plot(x, y, "k--", marker=next(markers, "s"), alpha=0.7,
                        label=f"contiguous room, {tp / 1024:g} KiB/token")
            elif shape.endswith(" naive"):
                ax.plot(x, y, "o:", alpha=0.8, label=f"{shape} {tp} (a write per row)")
            else:
                ax.plot(x, y, "o-", label=f"{shape} {tp}")
        if memcpy_gbps:
            ax.axhline(memcpy_gbps, color="grey", linestyle=":",
                       label=f"memcpy, one thread ({memcpy_gbps:.1f})")
        ax.set_xscale("log", base=2)
        ticks = sorted({c["tokens"] for c in mine})
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t // 1024}k" if t % 1024 == 0 else str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("prompt tokens")
        ax.set_title(link)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("GB/s (bytes / data-plane seconds)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(output)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="kvrail bench kv --json output, or - for stdin")
    parser.add_argument("-o", "--output", required=True, help="image to write (.png, .svg)")
    parser.add_argument("--title", default="kvrail bench kv")
    args = parser.parse_args()
    try:
        if args.json == "-":
            text, source = sys.stdin.read(), "stdin"
        else:
            with open(args.json, encoding="utf-8") as f:
                text, source = f.read(), args.json
        cases, memcpy_gbps = load_cases(text, source)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    plot(cases, memcpy_gbps, args.output, args.title)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
