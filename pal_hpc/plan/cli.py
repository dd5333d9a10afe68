"""`python -m pal_hpc.plan`: the flags of pal_hpc.main plus the planner's own, and the
table of every split."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from pal_hpc.config import ConfigError
from pal_hpc.plan.measure import details, gang_rows, measure_rates
from pal_hpc.plan.probe import _sync_probe_main, measure_sync_here, sync_counts
from pal_hpc.plan.model import Layout, _n, all_splits, make_plan, others_from_share



def format_plan(plan: dict, title: str) -> str:
    """The table of every split, the recommended and the default one marked."""
    inp = plan["inputs"]
    us = lambda s: f"{s * 1e6:,.1f} us" if s < 1e-3 else f"{s * 1e3:,.2f} ms"  # noqa: E731
    sync = ", ".join(f"{n} learners {us(s)}" for n, s in
                     sorted(((int(n), s) for n, s in inp["sync_s"].items()))) or "not needed"
    gang = ", ".join(f"{n} learners {us(s)}" for n, s in
                     sorted(((int(n), s) for n, s in inp.get("gang_s", {}).items()))) \
        or "not measured"
    lines = [title,
             f"measured (median CPU time, {inp.get('measure_s', 0):.1f} s): env step "
             f"{us(inp['env_step_s'])}, policy forward on {inp['envs_per_actor']} obs "
             f"{us(inp['forward_s'])}, replay insert {us(inp['insert_s'])}/transition",
             f"  a = actor per env step {us(inp['actor_step_s'])};  u = learner update "
             f"{us(inp['update_s'])} ({inp['phases_per_update']:g} phase(s), {inp['device']})",
             f"  r = Allreduce per phase (wall, learners polling it every 20 us): {sync}",
             f"  g = update of L learners at once (wall, real updates on their shares): {gang}",
             f"  cores: {', '.join(f'{c:g}' for c in inp['host_cores'])} (os.sched_getaffinity)"
             f";  batch {inp['batch_size']}, replay ratio {inp['replay_ratio']:g}",
             f"  other programs: {', '.join(f'{x:.1f}' for x in inp['host_others'])} busy "
             f"processes (the measurement got {inp.get('cpu_share', 1.0):.0%} of a core)"]
    lines.append("")
    header = f"{'split':<40} {'env steps/s':>12} {'updates/s':>10} " \
             f"{'grad batches/s':>15}  bottleneck"
    lines += [header, "-" * len(header)]
    for row in plan["table"]:
        marks = []
        if row["split"] == plan["split"]:
            marks.append("<- recommended")
        if row["split"] == plan["default"]["split"]:
            marks.append("(default split)")
        lines.append(f"{row['describe']:<40} {row['env_steps_per_s']:>12,.0f} "
                     f"{row['updates_per_s']:>10,.1f} {row['gradient_batches_per_s']:>15,.1f}"
                     f"  {row['bottleneck']:<9} {' '.join(marks)}".rstrip())
    flags = ""
    if len(plan["split"]) == 1:
        learners, actors = next(iter(plan["split"].values()))
        flags = f" (--learners-per-node {learners} --actors-per-node {actors})"
    lines += ["", f"recommended: {plan['describe']}{flags}: predicted "
                  f"{plan['env_steps_per_s']:,.0f} env steps/s, {plan['updates_per_s']:,.1f} "
                  f"updates/s, limited by the {plan['bottleneck']}",
              "(ranked by updates/s: with the split batch every split takes the same "
              "updates per env step, so the most updates/s is the least time per env step)"
              if inp["learner_batch"] == "split" else
              "(ranked by updates/s: more learners average more batches per update, so "
              "updates per env step fall; the model does not predict learning speed)"]
    return "\n".join(lines)


def _parser():
    from pal_hpc.config_io import build_parser

    parser = build_parser(prog="python -m pal_hpc.plan")
    parser.description = ("Measure one actor and one learner on this machine for this "
                          "configuration and predict every actor/learner split "
                          "(see the module docstring for the model).")
    group = parser.add_argument_group("planner")
    for flag, kw in _PLAN_FLAGS.items():
        group.add_argument(flag, **kw)
    return parser


_PLAN_FLAGS = {
    "--ranks": dict(type=int, required=True, metavar="N",
                    help="ranks of the job (mpiexec -n N); --ranks-per-node K splits them "
                         "into virtual nodes"),
    "--cores": dict(type=float, default=None, metavar="C",
                    help="cores of the host (default: os.sched_getaffinity)"),
    "--others": dict(type=float, default=None, metavar="X",
                     help="busy processes of other programs on the host (default: "
                          "estimated from the CPU share the measurement got; 0 = a quiet "
                          "machine)"),
    "--budget": dict(type=float, default=3.0, metavar="S",
                     help="seconds of measurement, about (default: 3)"),
    "--json": dict(action="store_true", help="print the plan as JSON instead of a table"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--sync-probe"]:
        _sync_probe_main()
        return 0
    from pal_hpc.config_io import load_config

    ns = _parser().parse_args(argv)          # --help, and argparse's errors, from here
    own = argparse.ArgumentParser(add_help=False)
    for flag, kw in _PLAN_FLAGS.items():
        own.add_argument(flag, **{k: v for k, v in kw.items() if k != "required"})
    _, rest = own.parse_known_args(argv)
    try:
        cfg = load_config(rest)
        if ns.ranks < 1:
            raise ConfigError(f"ranks: must be >= 1, got {ns.ranks}")
        cores = ns.cores if ns.cores is not None else len(os.sched_getaffinity(0))
        if not cores > 0:
            raise ConfigError(f"cores: must be > 0, got {ns.cores}")
        if ns.others is not None and not ns.others >= 0:
            raise ConfigError(f"others: must be >= 0, got {ns.others}")
        layout = Layout.one_host(ns.ranks, cores, cfg.ranks_per_node)
        splits = all_splits(layout, cfg.actors_per_node, cfg.learners_per_node)
        measured = measure_rates(cfg, budget_s=ns.budget)
        others = (ns.others if ns.others is not None
                  else others_from_share(cores, measured.cpu_share))
        layout = dataclasses.replace(layout, others=(others,))
    except ConfigError as exc:
        print(f"pal_hpc.plan: invalid configuration: {exc}", file=sys.stderr)
        return 2
    counts = sync_counts(layout, splits)
    split = cfg.learner_batch == "split"
    # g(L) is of CPU learners sharing cores (a GPU learner's u is its device's wall time).
    rows = gang_rows(counts, cfg.batch_size, split) if measured.device == "cpu" else None
    measured.sync_s, measured.gang_s = measure_sync_here(
        counts, measured.gradient_floats, rest, rows, ranks=layout.ranks)
    plan = make_plan(layout, measured.rates(), cfg.batch_size, cfg.replay_ratio,
                     cfg.actors_per_node, cfg.learners_per_node,
                     split=split)
    plan["inputs"].update(details(measured), envs_per_actor=cfg.envs_per_actor)
    plan["source"] = "measured"
    if ns.json:
        print(json.dumps(plan, indent=1))
    else:
        nodes = len(layout.sizes)
        print(format_plan(plan, f"pal_hpc.plan: {cfg.algo} on {cfg.env}, {ns.ranks} ranks "
                                f"on {_n(nodes, 'node')} "
                                f"({' + '.join(map(str, layout.sizes))} ranks)"))
    return 0
