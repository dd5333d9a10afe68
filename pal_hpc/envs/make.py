"""Building gymnasium environments by id: Atari ids with the standard preprocessing,
MinAtar ids as uint8 frames channels first."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np

from pal_hpc.options import ConfigError

_registered_ale = False
_registered_minatar = False

# ale-py's environment class: the ids whose spec names it are Atari games.
ALE_ENTRY_POINT = "ale_py.env:AtariEnv"

# The standard Atari preprocessing (Mnih et al. 2015; Machado et al. 2018): make_env's
# defaults for the Atari keywords.
ATARI_DEFAULTS = {"noop_max": 30, "frame_skip": 4, "screen_size": 84, "frame_stack": 4,
                  "terminal_on_life_loss": False}


def _register_ale() -> None:
    global _registered_ale
    if not _registered_ale:
        try:
            import ale_py
            gym.register_envs(ale_py)
        except ImportError:
            pass
        _registered_ale = True


# MinAtar's environment class (Young & Tian 2019; the `minatar` package: MinAtar/<Game>-v1
# with the game's minimal action set, -v0 with all six actions).
MINATAR_ENTRY_POINT = "minatar.gym:BaseEnv"


def _register_minatar() -> None:
    """Register MinAtar's ids with gymnasium (gymnasium 1.x loads no plugins by itself).

    minatar.gym logs a warning at import when seaborn is missing (it colours
    rendered frames with it; we never render): that one warning is kept out of every
    process's stderr."""
    global _registered_minatar
    if _registered_minatar:
        return
    _registered_minatar = True
    import logging

    class _NoSeabornWarning(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "seaborn" not in record.getMessage()

    root, quiet = logging.getLogger(), _NoSeabornWarning()
    root.addFilter(quiet)
    try:
        import minatar.gym
    except ImportError:
        return
    finally:
        root.removeFilter(quiet)
    if "MinAtar/Breakout-v1" not in gym.registry:
        minatar.gym.register_envs()


def is_minatar(env_id: str) -> bool:
    """Whether `env_id` is a MinAtar game (MinAtar/Breakout-v1, ...); False for unknown
    ids and where the `minatar` package is not installed."""
    if not _minatar_namespace(env_id):
        return False
    _register_minatar()
    try:
        return gym.spec(env_id).entry_point == MINATAR_ENTRY_POINT
    except gym.error.Error:
        return False


def minatar_action_set_note(env_id: str) -> str:
    """A start-up note for a MinAtar -v1 id (the game's minimal action set): the MinAtar
    paper's results, which its curves and pal_hpc.analyze's references show, used all
    six actions, the -v0 ids; "" for any other id."""
    if not (env_id.endswith("-v1") and is_minatar(env_id)):
        return ""
    return (f"pal_hpc: note: {env_id} has the game's minimal action set; the MinAtar "
            f"paper's results used all six actions ({env_id[:-1]}0)")


def _minatar_namespace(env_id: str) -> bool:
    """Whether `env_id` is in MinAtar's namespace: only those ids import `minatar.gym`,
    which imports matplotlib.pyplot (0.5 s of every rank's start-up otherwise)."""
    return isinstance(env_id, str) and env_id.startswith("MinAtar/")


def is_atari(env_id: str) -> bool:
    """Whether `env_id` is an ale-py game with image observations (ALE/<Game>-v5, and
    the older <Game>-v4 / <Game>NoFrameskip-v4 ids); False for unknown ids."""
    _register_ale()
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        return False
    return _is_atari_spec(spec)


def _is_atari_spec(spec: gym.envs.registration.EnvSpec) -> bool:
    return (spec.entry_point == ALE_ENTRY_POINT
            and spec.kwargs.get("obs_type", "rgb") != "ram")


def make_env(env_id: str, seed: int, *, atari_preprocessing: bool = True,
             noop_max: int = 30, frame_skip: int = 4, screen_size: int = 84,
             frame_stack: int = 4, terminal_on_life_loss: bool = False) -> gym.Env:
    """A seeded environment; raises ConfigError (a ValueError) naming the id if it is
    unknown or unsupported, so the job rejects it like any bad flag.

    Atari ids (`is_atari`) get `atari_env`'s preprocessing with the Atari keywords,
    unless `atari_preprocessing` is False; other ids refuse those keywords when not
    at their defaults.  A Box action space is rescaled to [-1, 1]: every algorithm
    acts in that range.  Whether the spaces suit the algorithm is its `check_env`."""
    _register_ale()
    if _minatar_namespace(env_id):
        _register_minatar()
    options = {"noop_max": noop_max, "frame_skip": frame_skip, "screen_size": screen_size,
               "frame_stack": frame_stack, "terminal_on_life_loss": terminal_on_life_loss}
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise ConfigError(f"env: cannot make {env_id!r}: {exc}") from None
    atari = _is_atari_spec(spec)
    if not atari:
        changed = [k for k, v in options.items() if v != ATARI_DEFAULTS[k]]
        if changed:
            raise ConfigError(f"{', '.join(changed)}: only for Atari (ALE/...) ids; "
                              f"{env_id!r} is not one")
    try:
        if atari and atari_preprocessing:
            env = atari_env(env_id, **options)
        elif spec.entry_point == MINATAR_ENTRY_POINT:
            env = minatar_env(env_id)
        else:
            env = gym.make(env_id)
    except gym.error.Error as exc:
        raise ConfigError(f"env: cannot make {env_id!r}: {exc}") from None
    if isinstance(env.action_space, gym.spaces.Box):
        space = env.action_space
        if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
            env.close()
            raise ConfigError(f"env: {env_id}'s action space {space} is unbounded; "
                              f"continuous actions are scaled from [-1, 1] to its bounds")
        # Algorithms act in [-1, 1] (tanh policies); the env gets its own bounds.
        ones = np.ones(space.shape, np.float32)     # float32 bounds: no precision warning
        env = gym.wrappers.RescaleAction(env, -ones, ones)
    if is_discrete_tuple(env.observation_space):
        env = flatten_discrete_tuple(env)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def is_discrete_tuple(space: gym.Space) -> bool:
    """A Tuple observation space made only of Discrete parts (Blackjack-v1's)."""
    return (isinstance(space, gym.spaces.Tuple) and len(space.spaces) > 0
            and all(isinstance(s, gym.spaces.Discrete) for s in space.spaces))


def flatten_discrete_tuple(env: gym.Env) -> gym.Env:
    """Observations of a Tuple of Discrete parts as one float32 vector of the parts'
    values (Blackjack-v1: (player sum, dealer card, usable ace) -> 3 floats, the
    reactor-model paper's 3-input network), not one-hot: the values are ordered
    quantities, and a vector keeps the network the paper's size."""
    parts = env.observation_space.spaces
    low = np.array([p.start for p in parts], np.float32)
    high = np.array([p.start + p.n - 1 for p in parts], np.float32)
    box = gym.spaces.Box(low, high, dtype=np.float32)
    return gym.wrappers.TransformObservation(
        env, lambda obs: np.asarray(obs, dtype=np.float32), box)


def atari_env(env_id: str, noop_max: int = 30, frame_skip: int = 4, screen_size: int = 84,
              frame_stack: int = 4, terminal_on_life_loss: bool = False) -> gym.Env:
    """An Atari game with the standard preprocessing, by gymnasium's own wrappers.

    The game is made with frameskip=1, which `AtariPreprocessing` requires; v5's other
    defaults stay (sticky actions with probability 0.25 per emulator frame among them).
    `AtariPreprocessing` repeats each action `frame_skip` times and max-pools the last
    two frames, starts each episode with 1..`noop_max` no-ops, resizes to
    `screen_size` squared grayscale and, with `terminal_on_life_loss`, ends the episode
    when a life is lost (the next reset starts a new game).  `FrameStackObservation`
    stacks `frame_stack` frames, oldest first: Box(0, 255, (4, 84, 84), uint8) by
    default.  Frames stay uint8 (networks scale them); rewards are not clipped (the
    algorithm's choice)."""
    _check_atari_options({"noop_max": noop_max, "frame_skip": frame_skip,
                          "screen_size": screen_size, "frame_stack": frame_stack,
                          "terminal_on_life_loss": terminal_on_life_loss})
    env = gym.make(env_id, frameskip=1)
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
        terminal_on_life_loss=terminal_on_life_loss, grayscale_obs=True, scale_obs=False)
    return gym.wrappers.FrameStackObservation(env, frame_stack)


def minatar_env(env_id: str, **kwargs) -> gym.Env:
    """A MinAtar game as image observations every algorithm here takes: its (10, 10, C)
    bool channels (one per kind of object) become uint8 frames (C, 10, 10), channels
    first, 255 where the object is -- the convention of every frame here (Atari's
    grayscale 0..255; the CNN torsos scale by 1/255, so the network sees MinAtar's 0/1
    exactly).  Frames are uint8 end to end, one byte per cell as the bools were.

    The game keeps the package's defaults, the paper's: sticky actions with
    probability 0.1 and difficulty ramping (`kwargs` go to the game: sticky_action_prob,
    difficulty_ramping).  Episodes end only by the game's own rules (no time limit, as
    in the paper; Freeway ends after 2,500 steps).

    gymnasium calls a -v0 id "out of date" beside its -v1; for MinAtar the two are
    different action sets, -v0 the paper's, so that warning is not passed on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*MinAtar/.*-v0 is out of date")
        env = gym.make(env_id, **kwargs)
    h, w, c = env.observation_space.shape
    box = gym.spaces.Box(0, 255, (c, h, w), np.uint8)
    return gym.wrappers.TransformObservation(
        env, lambda obs: np.ascontiguousarray(np.moveaxis(obs, -1, 0), dtype=np.uint8) * 255,
        box)


def _check_atari_options(options: dict) -> None:
    """Integers in range, with the keyword's name in the error."""
    lows = {"noop_max": 0, "frame_skip": 1, "screen_size": 1, "frame_stack": 1}
    for name, low in lows.items():
        value = options[name]
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{name}: must be an integer >= {low}, got {value!r}")
    if not isinstance(options["terminal_on_life_loss"], bool):
        raise ConfigError(f"terminal_on_life_loss: must be true or false, got "
                          f"{options['terminal_on_life_loss']!r}")


def action_info(env: gym.Env) -> tuple[tuple, np.dtype]:
    """Action shape and the dtype the replay stores it in (int64 index or float32)."""
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    return tuple(space.shape), np.dtype(np.float32)


def obs_info(env: gym.Env) -> tuple[tuple, np.dtype]:
    """Observation shape and the dtype the replay stores it in."""
    space = env.observation_space
    dtype = np.uint8 if space.dtype == np.uint8 else np.float32
    return tuple(space.shape), np.dtype(dtype)
