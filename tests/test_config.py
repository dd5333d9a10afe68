"""Config: defaults that validate, field-named errors, file + flag precedence, --help."""

import dataclasses
import json
import re
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from conftest import ROOT
from pal_hpc.algos import ALGOS
from pal_hpc.algos.base import AlgoConfig
from pal_hpc.algos.dqn import DQNConfig
from pal_hpc.algos.registry import SPECS
from pal_hpc.config import Config, ConfigError, option
from pal_hpc.config_io import build_parser, config_from_dict, config_to_dict, load_config


def with_dqn(**fields) -> Config:
    """The default Config with DQN options `fields`."""
    return dataclasses.replace(Config(), algo_config=DQNConfig(**fields))


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def test_defaults_validate_and_train_dqn_on_cartpole():
    cfg = Config()
    cfg.validate()
    assert (cfg.algo, cfg.env, cfg.device) == ("dqn", "CartPole-v1", "auto")
    assert cfg.algo_config == DQNConfig()
    assert load_config([]) == cfg


def test_every_field_is_documented():
    flags = [f for f in dataclasses.fields(Config) if f.metadata.get("flag", True)]
    assert "algo_config" not in [f.name for f in flags]   # not a flag; its fields are
    assert len(flags) == len(dataclasses.fields(Config)) - 1
    for f in flags:
        assert f.metadata.get("help"), f"{f.name} has no help text"
    assert "dqn" in ALGOS
    for algo, Algo in ALGOS.items():
        assert issubclass(Algo.Config, AlgoConfig), algo
        for f in dataclasses.fields(Algo.Config):
            assert f.metadata.get("help"), f"{algo}: {f.name} has no help text"


@pytest.mark.parametrize("name, value", [
    ("algo", "impala"), ("device", "tpu"), ("env", "NoSuchEnv-v0"),
    ("total_steps", 0), ("wall_time", -1.0), ("seed", -1), ("ranks_per_node", -2),
    ("actors_per_node", -1.0), ("actors_per_node", 1.5), ("actors_per_node", 1.0 + 1e-9),
    ("learners_per_node", 2.5), ("learners_per_node", float("nan")),
    ("eval_every", -1), ("eval_episodes", 0), ("eval_max_steps", -1),
    ("target_return", float("inf")),
    ("envs_per_actor", 0), ("replay_capacity", -1),   # 0 = auto
    ("replay_capacity", 32),  # < batch_size
    ("batch_size", 0), ("learning_starts", -1), ("learning_starts", 200_000),
    ("replay_ratio", 0.0), ("gamma", 0.0), ("gamma", 1.01),
    ("n_step", 0), ("publish_every", 0),
    ("per_alpha", 1.5), ("per_beta", -0.1), ("per_weights", "max"),
    ("per_eps", 0.0), ("fanout", 1), ("fanout", 12), ("fanout", 8192),
    ("torch_threads", 0), ("progress_every", 0.0),
    # wrong types set directly on the dataclass
    ("batch_size", 64.0), ("batch_size", True),
    ("env", 3), ("target_return", "high"),
    # values that used to pass validation and crash (or hang) the run
    ("per_eps", float("inf")), ("replay_ratio", float("inf")),
    ("replay_ratio", 1e300), ("seed", 99999999999999999999999), ("seed", 2**32),
    ("wall_time", float("inf")), ("checkpoint_every", float("inf")),
    ("target_return", float("-inf")),
])
def test_bad_value_names_its_field(name, value):
    cfg = dataclasses.replace(Config(), **{name: value})
    with pytest.raises(ConfigError, match=rf"^{name}: "):
        cfg.validate()


@pytest.mark.parametrize("name, value", [
    ("lr", 0.0), ("lr", float("nan")), ("target_update", 0),
    ("hidden", []), ("hidden", [64, 0]),
    ("eps_start", 1.2), ("eps_final", -0.1), ("exploration_steps", -1),
    ("eps_spread", -1.0), ("grad_clip", -1.0),
    # wrong types set directly on the dataclass
    ("dueling", 1), ("hidden", [64.0]),
    # values that used to pass validation and crash (or hang) the run
    ("lr", float("inf")), ("grad_clip", float("inf")),
])
def test_bad_dqn_value_names_its_field(name, value):
    cfg = with_dqn(**{name: value})
    with pytest.raises(ConfigError, match=rf"^{name}: "):
        cfg.validate()


def test_algo_config_must_be_the_algorithms_own():
    class Other(AlgoConfig):
        pass

    with pytest.raises(ConfigError, match="^algo_config: --algo dqn needs a DQNConfig, got Other"):
        dataclasses.replace(Config(), algo_config=Other()).validate()


def test_overwrite_and_resume_exclude_each_other():
    with pytest.raises(ConfigError, match="^overwrite: cannot be combined with --resume"):
        Config(overwrite=True, resume="latest").validate()
    Config(overwrite=True).validate()
    Config(seed=2**32 - 1, replay_ratio=1e6).validate()


def test_error_message_shows_the_value():
    with pytest.raises(ConfigError, match=r"^batch_size: must be >= 1, got 0$"):
        Config(batch_size=0).validate()


def test_eps_final_above_eps_start_is_rejected():
    with pytest.raises(ConfigError, match="^eps_final: must be <= eps_start"):
        with_dqn(eps_start=0.1, eps_final=0.2).validate()
    with pytest.raises(ConfigError, match="^eps_final: must be <= eps_start"):
        load_config(["--eps-start", "0.1", "--eps-final", "0.2"])


@pytest.mark.parametrize("value", [0, 0.25, 0.5, 0.999, 1, 2.0, 16])
def test_per_node_counts_accept_auto_fractions_and_integers(value):
    Config(actors_per_node=value, learners_per_node=value).validate()


def test_atari_env_is_known_when_ale_py_is_installed():
    pytest.importorskip("ale_py")
    Config(env="ALE/Pong-v5").validate()


def test_flags_override_defaults():
    cfg = load_config(["--total-steps", "500", "--hidden", "32", "16", "--dueling",
                       "--no-double-q", "--target-return", "195.5", "--device", "cpu",
                       "--actors-per-node", "0.75"])
    assert cfg.total_steps == 500 and cfg.algo_config.hidden == [32, 16]
    assert cfg.algo_config.dueling is True and cfg.algo_config.double_q is False
    assert cfg.algo_config == DQNConfig(hidden=[32, 16], dueling=True, double_q=False)
    assert cfg.target_return == 195.5 and cfg.device == "cpu"
    assert cfg.actors_per_node == 0.75
    assert load_config(["--target-return", "none"]).target_return is None


def test_bad_flag_value_is_rejected_naming_the_field():
    with pytest.raises(ConfigError, match="^gamma: "):
        load_config(["--gamma", "2"])
    with pytest.raises(ConfigError, match="^lr: must be > 0"):
        load_config(["--lr", "0"])
    with pytest.raises(SystemExit):  # argparse: not an int
        load_config(["--batch-size", "many"])


def _write(tmp_path, suffix, text):
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    return str(path)


def test_toml_file_then_flags(tmp_path):
    path = _write(tmp_path, ".toml",
                  'batch-size = 32\nlr = 5e-4\nhidden = [128]\ndueling = true\n'
                  'env = "Acrobot-v1"\nactors_per_node = 3\n')
    cfg = load_config(["--config", path])
    dqn = cfg.algo_config
    assert (cfg.batch_size, dqn.lr, dqn.hidden, dqn.dueling, cfg.env) == (
        32, 5e-4, [128], True, "Acrobot-v1")
    assert cfg.actors_per_node == 3.0 and cfg.gamma == Config().gamma
    # Flags win over the file; fields the flags do not name keep the file's value.
    cfg = load_config(["--config", path, "--batch-size", "16", "--no-dueling"])
    assert (cfg.batch_size, cfg.algo_config.dueling, cfg.algo_config.lr) == (16, False, 5e-4)
    # The order on the command line does not matter.
    assert load_config(["--batch-size", "16", "--config", path]).batch_size == 16


def test_toml_file_with_the_algorithm_table(tmp_path):
    path = _write(tmp_path, ".toml", 'batch_size = 32\n[dqn]\nlr = 5e-4\ntarget-update = 7\n')
    cfg = load_config(["--config", path])
    assert cfg.batch_size == 32
    assert cfg.algo_config == DQNConfig(lr=5e-4, target_update=7)
    # A flag wins over the file's table.
    assert load_config(["--config", path, "--lr", "1e-4"]).algo_config.lr == 1e-4


def test_json_file_then_flags(tmp_path):
    path = _write(tmp_path, ".json", json.dumps(
        {"total_steps": 2000, "target_return": 400, "seed": 7, "eval-every": 0}))
    cfg = load_config(["--config", path, "--seed", "9"])
    assert (cfg.total_steps, cfg.target_return, cfg.seed, cfg.eval_every) == (
        2000, 400.0, 9, 0)
    assert isinstance(cfg.target_return, float)


@pytest.mark.parametrize("suffix, text, pattern", [
    (".toml", "batch_sise = 32\n", "^batch_sise: unknown config key"),
    (".json", '{"no-such-field": 1}', "^no-such-field: unknown config key"),
    (".toml", 'batch_size = "32"\n', "^batch_size: expected an integer"),
    (".toml", "batch_size = 32.0\n", "^batch_size: expected an integer"),
    (".json", '{"dueling": 1}', "^dueling: expected true or false"),
    (".json", '{"hidden": 64}', "^hidden: expected a list of integers"),
    (".json", '{"lr": "fast"}', "^lr: expected a number"),
    (".json", '{"target_return": [1]}', "^target_return: expected a number or none"),
    (".toml", "batch_size = 0\n", "^batch_size: must be >= 1"),
    (".toml", "batch_size = \n", "^config: cannot read"),
    (".json", "[1, 2]", "^config: .* must hold a table"),
    (".yaml", "batch_size: 3\n", "^config: .* must end in .toml or .json"),
])
def test_bad_config_file(tmp_path, suffix, text, pattern):
    path = _write(tmp_path, suffix, text)
    with pytest.raises(ConfigError, match=pattern):
        load_config(["--config", path])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="^config: cannot read"):
        load_config(["--config", str(tmp_path / "absent.toml")])


def test_help_lists_every_field_with_its_default():
    text = build_parser().format_help()
    for f in dataclasses.fields(Config):
        if f.metadata.get("flag", True):
            assert flag(f.name) in text, f.name
    for algo, Algo in ALGOS.items():
        for f in dataclasses.fields(Algo.Config):
            assert flag(f.name) in text, f"{algo}: {f.name}"
    assert flag("algo_config") not in text
    assert "--no-dueling" in text and "--config" in text
    assert "(default: 100000)" in text and "(default: CartPole-v1)" in text
    words = " ".join(text.split())   # help lines wrap
    assert "(default: dqn 256 256;" in words and "(default: dqn 0.0023;" in words


def help_group(text: str, title: str) -> str:
    """The block of `--help` text under the group `title` (groups are separated by
    blank lines)."""
    (block,) = [b for b in text.split("\n\n") if b.startswith(title + ":")]
    return block


def test_help_lists_dqn_options_in_their_own_group():
    text = build_parser().format_help()
    block = help_group(text, "dqn options (--algo dqn)")
    for f in dataclasses.fields(DQNConfig):
        assert flag(f.name) in block, f.name
    for f in dataclasses.fields(Config):
        if f.metadata.get("flag", True) and f.name not in ("algo",):
            assert flag(f.name) + " " not in block, f.name


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as exc:
        load_config(["--help"])
    assert exc.value.code == 0
    assert "--replay-ratio" in capsys.readouterr().out


def test_dict_round_trip_is_plain_json():
    cfg = Config(target_return=475.0, actors_per_node=0.5, run_dir="runs/x",
                 algo_config=DQNConfig(hidden=[8, 4], dueling=True, lr=5e-4))
    d = config_to_dict(cfg)
    assert json.loads(json.dumps(d)) == d
    assert config_from_dict(json.loads(json.dumps(d))) == cfg
    assert config_from_dict({}) == Config()
    d["dqn"]["hidden"].append(2)  # the dict is a copy, not a view of the config
    assert cfg.algo_config.hidden == [8, 4]


def test_dict_nests_the_algorithm_options_under_its_name():
    cfg = Config(algo_config=DQNConfig(hidden=[8, 4], target_update=9))
    d = config_to_dict(cfg)
    assert d["algo"] == "dqn" and "algo_config" not in d
    assert d["dqn"] == dataclasses.asdict(cfg.algo_config)
    assert d["dqn"]["hidden"] == [8, 4] and d["dqn"]["target_update"] == 9
    assert not set(d) & {f.name for f in dataclasses.fields(DQNConfig)}
    # Flat and nested spellings read back the same.
    flat = {k: v for k, v in d.items() if k != "dqn"} | d["dqn"]
    assert config_from_dict(flat) == config_from_dict(d) == cfg


def test_config_from_dict_rejects_unknown_and_duplicate_keys():
    with pytest.raises(ConfigError, match="^bogus: unknown config key"):
        config_from_dict({"bogus": 1})
    with pytest.raises(ConfigError, match="^batch_size: given twice"):
        config_from_dict({"batch_size": 1, "batch-size": 2})
    # A table under a name that is no algorithm is an unknown key too.
    with pytest.raises(ConfigError, match="^impala: unknown config key"):
        config_from_dict({"impala": {"lr": 1e-3}})
    # In the algorithm's table, a key no algorithm takes is named.
    with pytest.raises(ConfigError, match="^bogus: an option of no algorithm; "
                                          "--algo dqn does not take it"):
        config_from_dict({"dqn": {"bogus": 1}})
    with pytest.raises(ConfigError, match="^batch_size: an option of no algorithm"):
        config_from_dict({"dqn": {"batch_size": 1}})   # run-wide keys are not nested
    with pytest.raises(ConfigError, match="^grad_clip: given twice"):
        config_from_dict({"dqn": {"grad_clip": 1.0, "grad-clip": 2.0}})
    with pytest.raises(ConfigError, match="^lr: given twice"):
        config_from_dict({"lr": 1e-3, "dqn": {"lr": 1e-3}})
    with pytest.raises(ConfigError, match="^lr: given twice"):
        config_from_dict({"dqn": {"lr": 1e-3}, "lr": 1e-3})
    with pytest.raises(ConfigError, match="^target_update: expected an integer"):
        config_from_dict({"dqn": {"target_update": "7"}})


def test_an_option_of_another_algorithm_is_refused_naming_it():
    with pytest.raises(ConfigError, match="^policy_delay: an option of td3; --algo dqn does "
                                          "not take it$"):
        config_from_dict({"policy_delay": 2})
    with pytest.raises(ConfigError, match="^init_alpha: an option of sac; --algo dqn"):
        config_from_dict({"dqn": {"init_alpha": 0.5}})
    with pytest.raises(ConfigError, match="^dueling: an option of dqn; --algo td3 does not "
                                          "take it$"):
        config_from_dict({"algo": "td3", "dueling": True})
    with pytest.raises(ConfigError, match="^tau: an option of ddpg, td3, sac; --algo dqn"):
        load_config(["--tau", "0.01"])
    # Another algorithm's table, when --algo names a different one.
    with pytest.raises(ConfigError, match=r"^td3: options of another algorithm \(--algo is dqn\)"):
        config_from_dict({"td3": {"policy_delay": 2}})
    with pytest.raises(ConfigError, match=r"^dqn: options of another algorithm \(--algo is td3\)"):
        config_from_dict({"algo": "td3", "dqn": {"lr": 1e-3}})


# A made-up algorithm, registered for the tests below only, so that what they check does
# not hang on the real algorithms' options and defaults.
@dataclasses.dataclass
class OtherConfig(AlgoConfig):
    eps_start: float = option(0.5, "initial epsilon")       # shared with DQN
    other_rate: float = option(0.25, "a rate")               # its own


class Other:
    name = "other"
    Config = OtherConfig
    run_defaults = {"gamma": 0.9, "batch_size": 48}


@pytest.fixture
def other(monkeypatch):
    monkeypatch.setitem(SPECS, "other", Other)


def test_an_option_of_a_made_up_algorithm_is_refused_naming_it(other):
    with pytest.raises(ConfigError, match="^other_rate: an option of other; --algo dqn does "
                                          "not take it$"):
        config_from_dict({"other_rate": 0.1})
    with pytest.raises(ConfigError, match="^target_update: an option of dqn; --algo other "
                                          "does not take it$"):
        config_from_dict({"algo": "other", "target_update": 5})
    with pytest.raises(ConfigError, match=r"^other: options of another algorithm \(--algo is dqn\)"):
        config_from_dict({"other": {"other_rate": 0.1}})


def test_a_shared_option_goes_to_the_chosen_algorithm(other):
    cfg = config_from_dict({"algo": "other", "eps_start": 0.75, "other_rate": 0.1})
    assert cfg.algo_config == OtherConfig(eps_start=0.75, other_rate=0.1)
    assert config_from_dict({"eps_start": 0.75}).algo_config == DQNConfig(eps_start=0.75)
    text = build_parser().format_help()
    assert "--other-rate" in help_group(text, "other options (--algo other)")
    # One --eps-start flag, listed with DQN, showing each algorithm's default.
    assert len(re.findall(r"^ +--eps-start ", text, re.M)) == 1
    block = " ".join(help_group(text, "dqn options (--algo dqn)").split())
    assert "epsilon-greedy [also other] (default: dqn 1.0; other 0.5)" in block


def test_run_defaults_fill_only_the_fields_not_given(other):
    assert Config(algo="other").algo_config == OtherConfig()
    cfg = config_from_dict({"algo": "other"})
    assert (cfg.gamma, cfg.batch_size) == (0.9, 48)
    assert config_from_dict({"algo": "other", "gamma": 0.95}).gamma == 0.95
    assert config_from_dict({"algo": "other", "gamma": 0.95}).batch_size == 48
    assert config_from_dict({}).gamma == Config().gamma == 0.99   # dqn has none
    words = " ".join(build_parser().format_help().split())
    assert re.search(r"--batch-size N transitions per update, the global batch: .*? "
                     r"\(default: 64;[^)]* other 48\)", words)


def test_default_list_is_not_shared_between_instances():
    a, b = Config(), Config()
    a.algo_config.hidden.append(1)
    assert b.algo_config.hidden == [256, 256]
    assert DQNConfig().hidden == [256, 256]


def test_resolved_run_dir():
    assert Config(run_dir="out/here").resolved_run_dir() == "out/here"
    now = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    assert Config().resolved_run_dir(now) == "runs/dqn-CartPole-v1-20240506-070809"
    assert Config(env="ALE/Pong-v5").resolved_run_dir(now) == "runs/dqn-ALE-Pong-v5-20240506-070809"


def test_reading_and_refusing_a_config_never_imports_torch():
    """`--help`, every algorithm's config and a refused value need only the specs
    (`pal_hpc.algos.registry`): torch costs each rank ~1.7 s of CPU to import, which a
    job that is refused at start-up should not wait for."""
    code = """if True:
        import sys
        from pal_hpc.config import ConfigError
        from pal_hpc.config_io import build_parser, load_config
        assert "--ppo-preset" in build_parser().format_help()
        for algo in ("dqn", "ddpg", "td3", "sac", "paac", "ppo"):
            load_config(["--algo", algo, "--env", "Pendulum-v1" if algo in ("ddpg", "td3", "sac")
                         else "CartPole-v1"])
        try:
            load_config(["--gamma", "1.5"])
        except ConfigError as exc:
            assert str(exc).startswith("gamma:"), exc
        from pal_hpc.algos.paac import NUM_ENVS, resolve_num_envs
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_every_algorithm_class_is_derived_from_its_spec():
    """The classes the runtime builds and the specs the configs read agree: one
    source for each name, Config and default."""
    assert set(ALGOS) == set(SPECS)
    for name, Algo in ALGOS.items():
        spec = SPECS[name]
        assert issubclass(Algo, spec) and Algo.name == spec.name == name
        assert Algo.Config is spec.Config and Algo.run_defaults == spec.run_defaults
        assert getattr(Algo, "on_policy", False) == spec.on_policy
