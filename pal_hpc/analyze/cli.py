"""Offline analysis of runs: a table per run and PNG plots.

    python -m pal_hpc.analyze RUN [RUN ...] [--threshold R] [--out DIR]
                              [--reference LABEL=VALUE[@STEPS] ...] [--no-published]
                              [--seeds] [--export-curves DIR] [--at STEPS,...]

RUN is a run directory (holding `metrics.h5`, maybe more log segments `metrics.1.h5`...,
and `summary.json`/`config.json` once the run has ended), a `metrics.h5` path, or a
`<run>.curves.json` that --export-curves wrote (the curves without the log:
`pal_hpc.analyze.curves`).  A run
still in progress or killed (no `summary.json`) is analysed from what its log holds so
far.  A RUN that cannot be read is reported, naming the file; the others are still
analysed and the exit status is 1.

Runs are grouped by (algorithm, environment).  A run counts as solved at its config's
`target_return`; --threshold applies to runs without one.

Published results go beside the runs they compare with: for an (algorithm,
environment) the papers and libraries pal_hpc reproduces report on (the MinAtar
paper's DQN, CleanRL's PPO; `pal_hpc.analyze.references` lists them with their
sources), and for every --reference given, each run's table has a row with the
reference and the run's own training return and greedy evaluation at the same env
steps, and the learning curves show it as a dotted level (and a star where it was
reported).  --no-published leaves out the built-in ones.

--seeds treats each group's runs as seeds of one setting: their mean and their
lowest-to-highest band over the env steps all of them reached, printed and drawn in
learning_curve_seeds.png (a warning names the settings that differ between them
beyond the seed; `pal_hpc.analyze.seeds`).

--at 5e5,1e6,... prints each group's runs at those env steps as a Markdown table:
the training return (rolling mean of the last 100 episodes ended by then) and the
greedy evaluation nearest to them (`pal_hpc.analyze.at_steps`).

Plots written into --out (default: the run's directory for one run, ./analysis for
several), in a subdirectory per group when there are several groups:
learning_curve_steps.png, learning_curve_wall.png, throughput.png, and scaling.png when
the group's runs have at least two different rank counts (with the planner's prediction
beside each run that was planned at start-up, `--actors-per-node auto`).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from pal_hpc.analyze.at_steps import parse_steps, steps_table
from pal_hpc.analyze.curves import SUFFIX, export_curves, load_curves
from pal_hpc.analyze.plots import write_plots
from pal_hpc.analyze.references import parse_reference, references_for, table_rows
from pal_hpc.analyze.runs import Run, group_runs, load_run, run_threshold
from pal_hpc.analyze.seeds import differing_settings, plot_seeds, seed_curves, seed_rows
from pal_hpc.analyze.table import format_table, run_stats


def _load_all(paths: list[str]) -> tuple[list[Run], int]:
    """The runs that could be read; each one that could not is reported on stderr.
    Returns (runs, number of failures)."""
    runs, failed = [], 0
    for path in paths:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                runs.append(load_curves(path) if str(path).endswith(SUFFIX) else load_run(path))
            except OSError as exc:      # its message names the file and says why
                print(f"error: {exc}", file=sys.stderr)
                failed += 1
                continue
        for w in caught:                 # segments skipped in a run that was read
            print(f"warning: {w.message}", file=sys.stderr)
    return runs, failed


def main(argv: list[str] | None = None) -> int:
    """`python -m pal_hpc.analyze ARGV`: each run's table on stdout, the plots into
    --out; returns the exit status (1 when a run or a plot could not be read or written)."""
    parser = argparse.ArgumentParser(prog="python -m pal_hpc.analyze", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run directory (with metrics.h5) or metrics.h5 path")
    parser.add_argument("--threshold", type=float, default=None,
                        help="evaluation mean return that counts as solved, for runs whose "
                             "config has no target_return (default: none)")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for the plots (default: the run's directory, or "
                             "./analysis for several runs)")
    parser.add_argument("--reference", action="append", default=[], metavar="LABEL=VALUE[@STEPS]",
                        help="a published return to show beside every group's runs, at "
                             "STEPS env steps if given (repeatable; e.g. \"paper=10@5e6\")")
    parser.add_argument("--no-published", action="store_true",
                        help="leave out the built-in published results "
                             "(pal_hpc.analyze.references)")
    parser.add_argument("--export-curves", type=Path, default=None, metavar="DIR",
                        help="also write each run's curves, config and summary to "
                             "DIR/<run>.curves.json (about 100 kB; a RUN may be such a file)")
    parser.add_argument("--seeds", action="store_true",
                        help="each group's runs are seeds of one setting: also their mean "
                             "and spread (learning_curve_seeds.png)")
    parser.add_argument("--at", default=None, metavar="STEPS,...",
                        help="also print each group's training return and greedy evaluation "
                             "at these env steps as a Markdown table (e.g. 5e5,1e6,5e6)")
    args = parser.parse_args(argv)
    try:
        at = parse_steps(args.at) if args.at is not None else []
    except ValueError as exc:
        parser.error(f"--at: {exc}")
    user = []
    for text in args.reference:
        try:
            user.append(parse_reference(text))
        except ValueError as exc:
            parser.error(f"--reference: {exc}")
    runs, failed = _load_all(args.runs)
    status = 1 if failed else 0
    if not runs:
        return status
    for run in runs if args.export_curves else ():
        try:
            print(f"wrote {export_curves(run, args.export_curves)}")
        except OSError as exc:
            print(f"error: cannot write {run.name}'s curves to {args.export_curves} "
                  f"({exc.strerror or exc})", file=sys.stderr)
            status = 1
    groups = group_runs(runs)
    out_root = args.out or (runs[0].dir if len(runs) == 1 else Path("analysis"))
    for (algo, env), group in groups.items():
        if len(groups) > 1:
            print(f"### {algo} on {env}: {len(group)} run{'s' * (len(group) > 1)}\n")
        thresholds = [run_threshold(r, args.threshold) for r in group]
        stats = [run_stats(r, t) for r, t in zip(group, thresholds)]
        refs = references_for(algo, env, user, published=not args.no_published)
        for run, s, t in zip(group, stats, thresholds):
            print(format_table(run, s, t, table_rows(run, refs)))
            print()
        if at:
            print(steps_table(group, at))
            print()
        out = out_root if len(groups) == 1 else out_root / f"{algo}-{env}".replace("/", "-")
        curves = seed_curves(group) if args.seeds and len(group) > 1 else {}
        if args.seeds and len(group) > 1:
            differ = differing_settings(group)
            if differ:
                print(f"warning: --seeds: these runs differ in more than the seed: "
                      f"{', '.join(differ)}", file=sys.stderr)
            print(f"seeds of {algo} on {env} ({len(group)} runs):")
            print("\n".join(seed_rows(curves)) or "- no curve that two runs share")
            print()
        try:
            for path in write_plots(group, stats, thresholds, out, refs):
                print(f"wrote {path}")
            if curves:
                out.mkdir(parents=True, exist_ok=True)
                plot_seeds(group, curves, out / "learning_curve_seeds.png", refs)
                print(f"wrote {out / 'learning_curve_seeds.png'}")
        except OSError as exc:
            hint = "" if args.out else "; pass --out DIR to write them elsewhere"
            print(f"error: cannot write the plots to {out} "
                  f"({exc.strerror or exc}){hint}", file=sys.stderr)
            status = 1
    return status
