"""``gptlab compare RUN [RUN ...] [--x steps|tokens|seconds] [--metric KEY,...] [--out PNG] [--json]``."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare",
        help="loss curves of several runs on one plot, and a table of their final figures",
        description="Read each run directory's metrics.jsonl, draw the train and val loss of every run on "
        "one PNG (against steps, tokens or seconds of training) and print their final figures.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories made by `gptlab train`")
    # no choices=X_AXES here: importing gptlab.train would load torch for every command; plot_runs checks --x
    p.add_argument("--x", default="steps", help="the x axis: steps, tokens or seconds (default steps)")
    p.add_argument(
        "--metric",
        default="",
        help="plot these per-step keys instead of the loss, comma-separated (a DPO run: logp/chosen,logp/rejected)",
    )
    p.add_argument("--out", default="compare.png", help="the PNG to write (default compare.png)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gptlab.evaluate.compare import load_runs, plot_runs, render_table

    runs = load_runs(args.runs)
    rows = [r.final() for r in runs]
    path = plot_runs(runs, args.out, args.x, [m for m in args.metric.split(",") if m])
    if args.json:
        print(json.dumps({"plot": str(path), "runs": rows}))
    else:
        print(render_table(rows), end="")
        print(f"plot: {path}")
    return 0
