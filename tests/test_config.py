"""Config: defaults that validate, field-named errors, file + flag precedence, --help."""

import dataclasses
import json
from datetime import datetime, timezone

import pytest

from pal_hpc.config import (Config, ConfigError, build_parser, config_from_dict,
                            config_to_dict, load_config)


def test_defaults_validate_and_train_dqn_on_cartpole():
    cfg = Config()
    cfg.validate()
    assert (cfg.algo, cfg.env, cfg.device) == ("dqn", "CartPole-v1", "auto")
    assert load_config([]) == cfg


def test_every_field_is_documented():
    for f in dataclasses.fields(Config):
        assert f.metadata.get("help"), f"{f.name} has no help text"


@pytest.mark.parametrize("name, value", [
    ("algo", "ppo"), ("device", "tpu"), ("env", "NoSuchEnv-v0"),
    ("total_steps", 0), ("wall_time", -1.0), ("seed", -1), ("ranks_per_node", -2),
    ("actors_per_node", -1.0), ("actors_per_node", 1.5), ("actors_per_node", 1.0 + 1e-9),
    ("learners_per_node", 2.5), ("learners_per_node", float("nan")),
    ("eval_every", -1), ("eval_episodes", 0), ("target_return", float("inf")),
    ("envs_per_actor", 0), ("replay_capacity", 0),
    ("replay_capacity", 32),  # < batch_size
    ("batch_size", 0), ("learning_starts", -1), ("learning_starts", 200_000),
    ("replay_ratio", 0.0), ("lr", 0.0), ("lr", float("nan")), ("gamma", 0.0), ("gamma", 1.01),
    ("n_step", 0), ("target_update", 0), ("publish_every", 0),
    ("hidden", []), ("hidden", [64, 0]), ("per_alpha", 1.5), ("per_beta", -0.1),
    ("per_eps", 0.0), ("fanout", 1), ("fanout", 12), ("fanout", 8192),
    ("eps_start", 1.2), ("eps_final", -0.1), ("exploration_steps", -1),
    ("eps_spread", -1.0), ("grad_clip", -1.0), ("torch_threads", 0), ("progress_every", 0.0),
    # wrong types set directly on the dataclass
    ("batch_size", 64.0), ("batch_size", True), ("dueling", 1), ("hidden", [64.0]),
    ("env", 3), ("target_return", "high"),
    # values that used to pass validation and crash (or hang) the run
    ("lr", float("inf")), ("per_eps", float("inf")), ("replay_ratio", float("inf")),
    ("replay_ratio", 1e300), ("seed", 99999999999999999999999), ("seed", 2**32),
    ("wall_time", float("inf")), ("grad_clip", float("inf")), ("checkpoint_every", float("inf")),
    ("target_return", float("-inf")),
])
def test_bad_value_names_its_field(name, value):
    cfg = dataclasses.replace(Config(), **{name: value})
    with pytest.raises(ConfigError, match=rf"^{name}: "):
        cfg.validate()


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
        Config(eps_start=0.1, eps_final=0.2).validate()


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
    assert cfg.total_steps == 500 and cfg.hidden == [32, 16]
    assert cfg.dueling is True and cfg.double_q is False
    assert cfg.target_return == 195.5 and cfg.device == "cpu"
    assert cfg.actors_per_node == 0.75
    assert load_config(["--target-return", "none"]).target_return is None


def test_bad_flag_value_is_rejected_naming_the_field():
    with pytest.raises(ConfigError, match="^gamma: "):
        load_config(["--gamma", "2"])
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
    assert (cfg.batch_size, cfg.lr, cfg.hidden, cfg.dueling, cfg.env) == (
        32, 5e-4, [128], True, "Acrobot-v1")
    assert cfg.actors_per_node == 3.0 and cfg.gamma == Config().gamma
    # Flags win over the file; fields the flags do not name keep the file's value.
    cfg = load_config(["--config", path, "--batch-size", "16", "--no-dueling"])
    assert (cfg.batch_size, cfg.dueling, cfg.lr) == (16, False, 5e-4)
    # The order on the command line does not matter.
    assert load_config(["--batch-size", "16", "--config", path]).batch_size == 16


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
        assert "--" + f.name.replace("_", "-") in text, f.name
    assert "--no-dueling" in text and "--config" in text
    assert "(default: 100000)" in text and "(default: CartPole-v1)" in text


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as exc:
        load_config(["--help"])
    assert exc.value.code == 0
    assert "--replay-ratio" in capsys.readouterr().out


def test_dict_round_trip_is_plain_json():
    cfg = Config(hidden=[8, 4], target_return=475.0, dueling=True, actors_per_node=0.5,
                 run_dir="runs/x")
    d = config_to_dict(cfg)
    assert json.loads(json.dumps(d)) == d
    assert config_from_dict(json.loads(json.dumps(d))) == cfg
    assert config_from_dict({}) == Config()
    d["hidden"].append(2)  # the dict is a copy, not a view of the config
    assert cfg.hidden == [8, 4]


def test_config_from_dict_rejects_unknown_and_duplicate_keys():
    with pytest.raises(ConfigError, match="^bogus: unknown config key"):
        config_from_dict({"bogus": 1})
    with pytest.raises(ConfigError, match="^batch_size: given twice"):
        config_from_dict({"batch_size": 1, "batch-size": 2})


def test_default_list_is_not_shared_between_instances():
    a, b = Config(), Config()
    a.hidden.append(1)
    assert b.hidden == [256, 256]


def test_resolved_run_dir():
    assert Config(run_dir="out/here").resolved_run_dir() == "out/here"
    now = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    assert Config().resolved_run_dir(now) == "runs/dqn-CartPole-v1-20240506-070809"
    assert Config(env="ALE/Pong-v5").resolved_run_dir(now) == "runs/dqn-ALE-Pong-v5-20240506-070809"
