"""
The zoo's :class:`~rl_zoo3.exp_manager.ExperimentManager`, taught VACO's hyperparameters.

* ``tv_threshold`` accepts ``lin_<value>`` schedules in YAML and ``-params`` (the zoo only converts a fixed list of keys).
* With asynchronous actors (``n_actors > 0``), the actors build the env the zoo builds: the env id with the entry's
  ``env_kwargs`` and ``env_wrapper`` (the model gets the zoo's VecEnv, which actors cannot rebuild by themselves).
* Bad input fails before anything is written, with a :class:`ZooUsageError`: a missing config file, an env without
  an entry (and no ``default``), a key that is neither a constructor argument nor one the zoo handles, an invalid
  value. If setting up a run still fails, its half-written run folder is removed so that the next run (and
  ``enjoy``'s "latest run") is not confused by it. The same goes for the run folder ``-optimize`` creates and leaves
  without a model.
"""

import difflib
import inspect
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rl_zoo3.exp_manager import ExperimentManager
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import LinearSchedule

from sb3_vaco.common.wrappers import WrappedEnvFactory

# Keys of a YAML entry that the zoo consumes itself instead of passing them to the algorithm's constructor
ZOO_KEYS = frozenset(
    {
        "n_timesteps",
        "n_envs",
        "normalize",
        "env_wrapper",
        "vec_env_wrapper",
        "callback",
        "frame_stack",
        "monitor_kwargs",
        "env_kwargs",
    }
)
# Constructor arguments that the zoo sets from its own command-line options
ZOO_SET_ARGUMENTS = {
    "env": "--env",
    "seed": "--seed",
    "verbose": "--verbose",
    "device": "--device",
    "tensorboard_log": "-tb/--tensorboard-log",
    "_init_setup_model": "(internal)",
}
# Hyperparameters of VACO that may be a schedule written as ``lin_<initial value>``
VACO_SCHEDULE_KEYS = ("tv_threshold",)


def _actor_algos() -> set[str]:
    """The zoo algos that take ``n_actors`` (asynchronous actors)."""
    from sb3_vaco.zoo import ZOO_ALGOS

    return {name for name, cls in ZOO_ALGOS.items() if "n_actors" in constructor_parameters(cls)}


class ZooUsageError(ValueError):
    """Invalid command-line input or configuration: reported as one clear message with a non-zero exit code."""


def constructor_parameters(algo_class: type[BaseAlgorithm]) -> dict[str, inspect.Parameter]:
    """
    The keyword arguments that ``algo_class(...)`` accepts, following ``**kwargs`` up the MRO
    (``LaggedPPO(policy, env, *args, policy_lag, **kwargs)`` accepts everything ``PPO`` does).

    :param algo_class: an SB3 algorithm class
    :return: name → parameter (with its default), ``self`` excluded; a subclass's parameter hides its parent's
    """
    parameters: dict[str, inspect.Parameter] = {}
    for cls in algo_class.__mro__:
        if "__init__" not in vars(cls):
            continue
        signature = inspect.signature(vars(cls)["__init__"]).parameters.values()
        for parameter in signature:
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY) and parameter.name != "self":
                parameters.setdefault(parameter.name, parameter)
        if not any(parameter.kind == parameter.VAR_KEYWORD for parameter in signature):
            break
    return parameters


def constructor_arguments(algo_class: type[BaseAlgorithm]) -> set[str]:
    """
    The names of the keyword arguments that ``algo_class(...)`` accepts (see :func:`constructor_parameters`).

    :param algo_class: an SB3 algorithm class
    :return: the argument names, ``self`` excluded
    """
    return set(constructor_parameters(algo_class))


def constructor_defaults(algo_class: type[BaseAlgorithm]) -> dict[str, Any]:
    """
    The default of each argument of ``algo_class(...)`` that has one: what a YAML entry gets for a key it omits.

    :param algo_class: an SB3 algorithm class
    :return: name → default value
    """
    return {
        name: parameter.default
        for name, parameter in constructor_parameters(algo_class).items()
        if parameter.default is not inspect.Parameter.empty
    }


def is_constructor_default(value: Any, default: Any) -> bool:
    """
    Whether a YAML value sets an argument to its default (``1`` and ``1.0`` alike; booleans only equal booleans).

    :param value: the value from a YAML entry (before the zoo converts schedules such as ``lin_0.001``)
    :param default: the constructor default
    """
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default
    scalars = (int, float, str, type(None))
    return isinstance(value, scalars) and isinstance(default, scalars) and value == default


def check_hyperparameter_keys(
    algo: str, algo_class: type[BaseAlgorithm], hyperparams: dict[str, Any], source: dict[str, str]
) -> None:
    """
    Reject keys the run would choke on later (with a ``TypeError`` from the constructor, after the run folder
    was created): unknown keys, with the closest valid one suggested, and arguments the zoo sets itself.

    :param algo: the algorithm's name in the zoo
    :param algo_class: its class
    :param hyperparams: the merged hyperparameters (YAML entry, Optuna trial, ``-params``)
    :param source: where each key came from, for the message
    :raises ZooUsageError: on the first bad key
    """
    valid = (constructor_arguments(algo_class) - set(ZOO_SET_ARGUMENTS)) | ZOO_KEYS
    for key in hyperparams:
        if key in ZOO_SET_ARGUMENTS:
            raise ZooUsageError(
                f"`{key}` (from {source.get(key, 'the config')}) is set by the zoo for {algo}: use {ZOO_SET_ARGUMENTS[key]}"
            )
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" Did you mean `{close[0]}`?" if close else ""
            raise ZooUsageError(
                f"unknown hyperparameter `{key}` for {algo} (from {source.get(key, 'the config')}).{hint} "
                f"Valid keys: {', '.join(sorted(valid))}"
            )


def parse_vaco_schedule(key: str, value: Any) -> Any:
    """
    Convert a VACO schedule from YAML: ``lin_<x>`` decays linearly from ``x`` (start) to 0 (end of training),
    like the zoo's ``learning_rate: lin_<x>``. Numbers are kept as they are.

    :param key: the hyperparameter's name, for the message
    :param value: the value from YAML or ``-params``
    :return: a float or a :class:`~stable_baselines3.common.utils.LinearSchedule`
    :raises ZooUsageError: for any other string or type
    """
    if isinstance(value, bool):
        raise ZooUsageError(f"`{key}` must be a number or 'lin_<number>', got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        kind, _, initial = value.partition("_")
        try:
            initial_value = float(initial)
        except ValueError:
            initial_value = -1.0
        if kind == "lin" and initial_value > 0:
            # SB3's own class, so that a saved model does not need rl_zoo3 to load
            return LinearSchedule(start=initial_value, end=0.0, end_fraction=1.0)
    raise ZooUsageError(f"`{key}` must be a number > 0 or a schedule 'lin_<number>' (e.g. 'lin_0.2'), got {value!r}")


def load_config_file(config: str) -> dict[str, Any]:
    """
    Read a YAML hyperparameter file, failing with a clear message.

    :param config: path of the ``.yml`` / ``.yaml`` file
    :return: the mapping env id → entry
    """
    path = Path(config)
    if not path.is_file():
        raise ZooUsageError(f"hyperparameter file not found: {config}")
    try:
        content = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ZooUsageError(f"could not parse {config}: {error}") from error
    if not isinstance(content, dict):
        raise ZooUsageError(f"{config} must map env ids (and `default`) to hyperparameter entries")
    return content


class VACOExperimentManager(ExperimentManager):
    """
    :class:`~rl_zoo3.exp_manager.ExperimentManager` with VACO's schedules, configuration checks and clean-up.
    Same constructor as the zoo's; ``rl_zoo3.train`` uses it once :func:`sb3_vaco.zoo.cli.main` installed it.
    """

    _created_run_folder = False

    def read_hyperparameters(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Check the config file and the env's entry, read them as the zoo does, then check every key."""
        if self.config.endswith((".yml", ".yaml")):
            entries = load_config_file(self.config)
            env_id = self.env_name.gym_id
            if env_id not in entries and not (self._is_atari and "atari" in entries):
                if "default" not in entries:
                    raise ZooUsageError(
                        f"no hyperparameters for {env_id} in {self.config} (and no `default` entry): "
                        f"add an entry `{env_id}:` or pass --conf-file"
                    )
                print(f"Warning: no entry for {env_id} in {self.config}, using its `default` entry (not tuned for this env)")
            entry = entries.get(env_id)
            if entry is not None and not isinstance(entry, dict):
                raise ZooUsageError(f"the entry for {env_id} in {self.config} must be a mapping, got {entry!r}")

        # Load the Optuna trial here rather than in the zoo, which skips --trial-id 0 (falsy) and ignores --trial-id
        # without a storage. Same precedence: YAML entry < trial < -params.
        original_custom, trial_id = self.custom_hyperparams, self.trial_id
        custom = original_custom or {}
        trial_params: dict[str, Any] = {}
        if trial_id is not None:
            if not (self.storage and self.study_name):
                raise ZooUsageError("--trial-id needs --storage and --study-name (the study to load the trial from)")
            print(f"Loading trial {trial_id} from the Optuna study {self.study_name}")
            trial_params = self.load_trial(self.storage, self.study_name, trial_id)
            self.custom_hyperparams, self.trial_id = {**trial_params, **custom}, None
        try:
            hyperparams, saved_hyperparams = super().read_hyperparameters()
        finally:
            self.custom_hyperparams, self.trial_id = original_custom, trial_id

        from sb3_vaco.zoo import ZOO_ALGOS

        if self.algo in ZOO_ALGOS:
            source = {
                key: "-params" if key in custom else f"trial {trial_id}" if key in trial_params else self.config
                for key in hyperparams
            }
            check_hyperparameter_keys(self.algo, ZOO_ALGOS[self.algo], hyperparams, source)
            for key in VACO_SCHEDULE_KEYS:
                if key in hyperparams:
                    parse_vaco_schedule(key, hyperparams[key])  # fail now, before the run folder exists
            # A tuple (from -params policy_lag:(2,8)) would be saved as a Python-specific YAML tag
            for hyperparams_dict in (hyperparams, saved_hyperparams):
                if isinstance(hyperparams_dict.get("policy_lag"), tuple):
                    hyperparams_dict["policy_lag"] = list(hyperparams_dict["policy_lag"])
        return hyperparams, saved_hyperparams

    def load_trial(self, storage: str, study_name: str, trial_id: int | None = None, convert: bool = True) -> dict[str, Any]:
        """The zoo's :meth:`~rl_zoo3.exp_manager.ExperimentManager.load_trial`, with clear errors."""
        if storage.endswith(".log") and not Path(storage).is_file():
            raise ZooUsageError(f"no Optuna journal at {storage}")
        try:
            return super().load_trial(storage, study_name, trial_id, convert)
        except KeyError as error:
            raise ZooUsageError(f"no study {study_name!r} in {storage}") from error
        except IndexError as error:
            raise ZooUsageError(f"no trial {trial_id} in the study {study_name!r} of {storage}") from error

    @staticmethod
    def _preprocess_schedules(hyperparams: dict[str, Any]) -> dict[str, Any]:
        hyperparams = ExperimentManager._preprocess_schedules(hyperparams)
        for key in VACO_SCHEDULE_KEYS:
            if key in hyperparams:
                hyperparams[key] = parse_vaco_schedule(key, hyperparams[key])
        return hyperparams

    def _preprocess_hyperparams(
        self, hyperparams: dict[str, Any]
    ) -> tuple[dict[str, Any], Callable | None, list[BaseCallback], Callable | None]:
        """
        The zoo's pre-processing; then, with asynchronous actors (``n_actors > 0``), tell the actors to build the env
        the zoo builds: the model gets the zoo's VecEnv (not an env id), so without an ``env_fn`` the actors would
        have nothing to build. They get ``gym.make(env id, **env_kwargs)`` inside the entry's ``env_wrapper`` (a
        :class:`~sb3_vaco.common.wrappers.WrappedEnvFactory`), and step the same wrapped env as a synchronous run.
        An ``env_fn`` (or ``env_kwargs``) given in ``actor_backend_kwargs`` is kept.
        """
        wrapper_setting = hyperparams.get("env_wrapper")
        hyperparams, env_wrapper, callbacks, vec_env_wrapper = super()._preprocess_hyperparams(hyperparams)
        if hyperparams.get("n_actors") and self.algo in _actor_algos():
            settings = dict(hyperparams.get("actor_backend_kwargs") or {})  # a copy: the saved config stays as written
            if settings.get("env_fn") is None:
                label = "" if wrapper_setting is None else str(wrapper_setting)
                settings["env_fn"] = WrappedEnvFactory(self.env_name.gym_id, env_wrapper, label)
                if self.env_kwargs and settings.get("env_kwargs") is None:
                    settings["env_kwargs"] = dict(self.env_kwargs)
            hyperparams["actor_backend_kwargs"] = settings
        return hyperparams, env_wrapper, callbacks, vec_env_wrapper

    def setup_experiment(self) -> tuple[BaseAlgorithm, dict[str, Any]] | None:
        """The zoo's set-up; if it fails, remove the run folder it created and report invalid values clearly."""
        self._created_run_folder = not os.path.exists(self.save_path)
        try:
            return super().setup_experiment()
        except ZooUsageError:
            self._remove_run_folder()
            raise
        except (ValueError, TypeError) as error:
            # Invalid values are rejected by the algorithm's constructor (e.g. VACO's checks)
            self._remove_run_folder()
            raise ZooUsageError(f"could not set up {self.algo} on {self.env_name.gym_id}: {error}") from error
        except BaseException:
            self._remove_run_folder()
            raise

    def hyperparameters_optimization(self) -> None:
        """Run the zoo's study; then remove the model-less run folder that ``setup_experiment()`` created for it."""
        try:
            super().hyperparameters_optimization()
        finally:
            self._remove_run_folder()

    def _remove_run_folder(self) -> None:
        """Remove this run's folder if this process created it and it holds no saved model."""
        path = Path(self.save_path)
        if self._created_run_folder and path.is_dir() and not any(path.glob("*.zip")):
            shutil.rmtree(path, ignore_errors=True)
