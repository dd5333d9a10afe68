"""Configs in and out: a Config to and from plain values (saved with runs, read from
`--config FILE` in TOML or JSON), and the command line (`build_parser`: every documented
field of `pal_hpc.config.Config` and of each algorithm's config is a flag; `load_config`:
defaults < file < flags, validated before any rank starts work)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import tomllib
from pathlib import Path
from typing import Any

from pal_hpc.config import (AUTO, Config, ConfigError, PerNode, _algo_field_types, _base_type,
                            _check_choice, _check_type, _field_types, _is_optional,
                            algo_options, algorithms)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain JSON types (for saving with a run): the run-wide fields, and
    the algorithm's own under its name ({"algo": "td3", ..., "td3": {...}})."""
    out = {name: copy.deepcopy(getattr(cfg, name)) for name in _field_types()}
    if cfg.algo_config is not None:
        out[cfg.algo] = dataclasses.asdict(cfg.algo_config)
    return out


def _spelled(d: dict[str, Any]) -> dict[str, Any]:
    """Keys with `-` spelled with `_`; a key given in both spellings is an error."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = str(key).replace("-", "_")
        if name in out:
            raise ConfigError(f"{name}: given twice (as '_' and '-' spellings)")
        out[name] = value
    return out


def _atari_id(env_id) -> bool:
    # Imported here: pal_hpc.envs imports this module (ConfigError).
    from pal_hpc.envs import is_atari
    return isinstance(env_id, str) and is_atari(env_id)


def _minatar_id(env_id) -> bool:
    from pal_hpc.envs.make import is_minatar
    return isinstance(env_id, str) and env_id.startswith("MinAtar/") and is_minatar(env_id)


def config_from_dict(d: dict[str, Any]) -> Config:
    """A Config from plain values (keys with `_` or `-`); missing keys keep their defaults.

    Run-wide keys and the chosen algorithm's options may come flat; the algorithm's may
    also come as a table under its name (as `config_to_dict` writes them).  Run-wide
    keys not given take the algorithm's `run_defaults` (TD3 wants gamma 0.98 and batches
    of 256), then the dataclass defaults.  Unknown keys, another algorithm's options and
    wrongly typed values raise `ConfigError`.  Does not call `validate()` (load_config
    does), so a saved config can be inspected even when its env is not installed here.
    """
    spelled_as = {str(key).replace("-", "_"): key for key in d}
    d = _spelled(d)
    types_ = _field_types()
    registry = algorithms()
    algo = d.get("algo", Config.algo)
    if not isinstance(algo, str) or algo not in registry:
        _check_choice("algo", algo, tuple(registry))
    Algo = registry[algo]
    owners = algo_options()
    values: dict[str, Any] = {}
    algo_values: dict[str, Any] = {}
    for name, value in d.items():
        if name in registry and isinstance(value, dict):
            if name != algo:
                raise ConfigError(f"{name}: options of another algorithm (--algo is {algo})")
            for key, v in _spelled(value).items():
                if key in algo_values:
                    raise ConfigError(f"{key}: given twice")
                algo_values[key] = v
        elif name in types_:
            values[name] = _check_type(name, types_[name], value)
        elif name in owners:
            if name in algo_values:
                raise ConfigError(f"{name}: given twice")
            algo_values[name] = value
        else:
            raise ConfigError(f"{spelled_as.get(name, name)}: unknown config key")
    algo_types = _algo_field_types(Algo.Config)
    for name, value in algo_values.items():
        if name not in algo_types:
            raise ConfigError(f"{name}: an option of {', '.join(owners.get(name, ['no algorithm']))}"
                              f"; --algo {algo} does not take it")
        algo_values[name] = _check_type(name, algo_types[name], value)
    if getattr(Algo, "atari_run_defaults", None) and _atari_id(values.get("env", Config.env)):
        # The algorithm's published Atari settings, for what the user did not set.
        for name, value in Algo.atari_run_defaults.items():
            values.setdefault(name, value)
        for name, value in getattr(Algo, "atari_defaults", {}).items():
            algo_values.setdefault(name, value)
    minatar_own = getattr(Algo, "minatar_defaults", {})
    if minatar_own and _minatar_id(values.get("env", Config.env)):
        # The MinAtar network (PAAC, PPO; DQN's MinAtar settings are its preset's).
        for name, value in minatar_own.items():
            algo_values.setdefault(name, value)
    field = getattr(Algo, "preset_field", None)
    env_defaults = getattr(Algo, "env_defaults", None)
    if env_defaults is not None:
        # The preset's values for the env's family (PPO's CleanRL scripts, the zoo's
        # entries), run-wide ones included, for what the user did not set.
        preset = algo_values.get(field, getattr(Algo.Config, field))
        for name, value in env_defaults(values.get("env", Config.env), preset).items():
            (values if name in types_ else algo_values).setdefault(name, value)
    if field:
        # A named set of option values, under the flags the user gave.
        preset = algo_values.get(field, getattr(Algo.Config, field))
        for name, value in Algo.presets.get(preset, {}).items():
            algo_values.setdefault(name, value)
    for name, value in getattr(Algo, "run_defaults", {}).items():
        values.setdefault(name, value)
    return Config(**values, algo_config=Algo.Config(**algo_values))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw key/value table of a `.toml` or `.json` config file."""
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        elif suffix == ".json":
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        else:
            raise ConfigError(f"config: {path} must end in .toml or .json")
    except (OSError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config: cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a table of field = value")
    return data


# ---------------------------------------------------------------------------------------
# Command line.

def _optional_float(text: str) -> float | None:
    if text.strip().lower() in ("none", "null", ""):
        return None
    return float(text)


def _per_node_arg(text: str) -> float | str:
    """A number, or the word as given (validate() names the field if it is not auto)."""
    try:
        return float(text)
    except ValueError:
        return text.strip()


def _add_flag(parser, name: str, tp: Any, help_text: str, metadata: dict) -> None:
    flag = "--" + name.replace("_", "-")
    kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS,
                          "help": help_text.replace("%", "%%")}
    base = _base_type(tp)
    if tp == PerNode:
        kw.update(type=_per_node_arg, metavar=f"X|{AUTO}")
    elif base is bool:
        kw["action"] = argparse.BooleanOptionalAction
    elif base is list:
        kw.update(nargs="+", type=int, metavar="N")
    elif _is_optional(tp):
        kw.update(type=_optional_float, metavar="X")
    else:
        kw["type"] = base
        if "choices" in metadata:
            kw["choices"] = metadata["choices"]
        else:
            kw["metavar"] = {int: "N", float: "X", str: "STR"}[base]
    parser.add_argument(flag, **kw)


def _shown(default: Any) -> str:
    return ("none" if default is None else '""' if default == "" else
            " ".join(map(str, default)) if isinstance(default, list) else str(default))


def build_parser(prog: str = "python -m pal_hpc.main") -> argparse.ArgumentParser:
    """An argparse parser with one flag per Config field (`--total-steps` for total_steps)
    and, in a group per algorithm, one per algorithm option.

    Flags default to "not given" (argparse.SUPPRESS) so that only the flags a user typed
    override the config file; the defaults are shown in each help line.  An option that
    several algorithms take is one flag, listed with the first of them, with each one's
    default.
    """
    registry = algorithms()
    parser = argparse.ArgumentParser(
        prog=prog, description="Train an RL agent with actor and learner MPI ranks.",
        epilog="Precedence: defaults < the algorithm's defaults < --config file < "
               "command-line flags.  A run-wide default followed by 'but td3 ...' is "
               "another for that --algo.")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="TOML or JSON file of field = value (keys with _ or -)")
    types_ = _field_types()
    for f in dataclasses.fields(Config):
        if f.name not in types_:
            continue
        default = (f.default_factory() if f.default is dataclasses.MISSING
                   else f.default)
        shown = _shown(default)
        per_algo = [f"{name} {_shown(Algo.run_defaults[f.name])}"
                    for name, Algo in registry.items()
                    if f.name in getattr(Algo, "run_defaults", {})]
        if per_algo:
            shown += "; but " + "; ".join(per_algo)
        choices = {"choices": tuple(registry)} if f.name == "algo" else {}
        _add_flag(parser, f.name, types_[f.name], f"{f.metadata['help']} (default: {shown})",
                  {**f.metadata, **choices})
    owners = algo_options()
    added: set[str] = set()
    for algo, Algo in registry.items():
        group = parser.add_argument_group(f"{algo} options (--algo {algo})")
        types = _algo_field_types(Algo.Config)
        for f in dataclasses.fields(Algo.Config):
            if f.name in added:
                continue
            added.add(f.name)
            defaults = [(name, getattr(registry[name].Config(), f.name)) for name in owners[f.name]]
            if len({_shown(v) for _, v in defaults}) == 1:
                shown = _shown(defaults[0][1])
            else:
                shown = "; ".join(f"{name} {_shown(v)}" for name, v in defaults)
            also = [n for n in owners[f.name] if n != algo]
            note = f" [also {', '.join(also)}]" if also else ""
            _add_flag(group, f.name, types[f.name],
                      f"{f.metadata['help']}{note} (default: {shown})", dict(f.metadata))
    return parser


def load_config(argv: list[str] | None = None) -> Config:
    """Defaults < the algorithm's run defaults < `--config FILE` < flags given in `argv`
    (sys.argv[1:] when None); validated."""
    ns = vars(build_parser().parse_args(argv))
    path = ns.pop("config")
    values: dict[str, Any] = {}
    # Flags win over the file, also over an option in the file's algorithm table.
    for key, value in (read_config_file(path) if path else {}).items():
        name = str(key).replace("-", "_")
        if name in algorithms() and isinstance(value, dict):
            values[key] = {k: v for k, v in value.items() if k.replace("-", "_") not in ns}
        elif name not in ns:
            values[key] = value
    values.update(ns)                     # only flags actually given are in `ns`
    cfg = config_from_dict(values)
    cfg.validate()
    return cfg
