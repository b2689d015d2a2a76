"""
Optuna search spaces for ``-optimize`` and the converters that turn a stored trial back into hyperparameters
(``--trial-id``), registered into rl_zoo3's ``HYPERPARAMS_SAMPLER`` / ``HYPERPARAMS_CONVERTER`` by
:func:`sb3_vaco.zoo.register_algos`.
"""

from typing import Any

import optuna
from rl_zoo3.hyperparams_opt import convert_onpolicy_params, sample_ppo_params

from sb3_vaco.vaco.vaco import TV_REFERENCES

# VACO's own knobs, sampled on top of the PPO space (categorical, like the zoo's clip_range)
TV_THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.5)
VTRACE_RHO_BARS = (0.5, 1.0, 2.0)
VTRACE_C_BARS = (0.5, 1.0)


def convert_vaco_params(sampled_params: dict[str, Any]) -> dict[str, Any]:
    """
    Turn the parameters stored with a trial into VACO hyperparameters (for ``--trial-id`` reloads).

    The PPO part goes through the zoo's :func:`~rl_zoo3.hyperparams_opt.convert_onpolicy_params`
    (``one_minus_gamma`` → ``gamma``, ``*_pow`` → powers of two, ``net_arch``/``activation_fn`` → ``policy_kwargs``);
    VACO's keys (``tv_threshold``, ``vtrace_rho_bar``, ``vtrace_c_bar``, ``tv_reference``) are already
    constructor arguments and pass through unchanged.

    :param sampled_params: ``trial.params`` of a trial sampled by :func:`sample_vaco_params`
    :return: keyword arguments for :class:`~sb3_vaco.VACO`
    """
    return convert_onpolicy_params(sampled_params)


def sample_vaco_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """
    Sampler for VACO: the zoo's PPO search space (:func:`rl_zoo3.hyperparams_opt.sample_ppo_params`, same names,
    ranges and choices) without ``clip_range``, which VACO's TV filter does not use, plus the TV budget δ
    (``tv_threshold``), V-trace's truncations ρ̄ and c̄ and the reference policy of the filter.

    ``policy_lag`` is not sampled: fix it with ``-params policy_lag:K`` (or in the YAML entry).
    A ``batch_size`` larger than the rollout (``n_steps * n_envs``), which VACO rejects, prunes the trial
    at once, before any environment is created.

    :param trial: the Optuna trial
    :param n_actions: number of actions (unused, part of the zoo's sampler signature)
    :param n_envs: number of training environments
    :param additional_args: extra arguments from the zoo (unused)
    :return: keyword arguments for :class:`~sb3_vaco.VACO`
    """
    # The PPO space, as in rl-zoo3 2.9 (checked against sample_ppo_params by tests/test_zoo.py)
    batch_size_pow = trial.suggest_int("batch_size_pow", 2, 10)
    n_steps_pow = trial.suggest_int("n_steps_pow", 5, 12)
    one_minus_gamma = trial.suggest_float("one_minus_gamma", 0.0001, 0.03, log=True)
    one_minus_gae_lambda = trial.suggest_float("one_minus_gae_lambda", 0.0001, 0.1, log=True)
    learning_rate = trial.suggest_float("learning_rate", 1e-5, 0.002, log=True)
    ent_coef = trial.suggest_float("ent_coef", 0.00000001, 0.1, log=True)
    n_epochs = trial.suggest_categorical("n_epochs", [1, 5, 10, 20])
    max_grad_norm = trial.suggest_float("max_grad_norm", 0.3, 2)
    net_arch = trial.suggest_categorical("net_arch", ["tiny", "small", "medium"])
    activation_fn = trial.suggest_categorical("activation_fn", ["tanh", "relu"])
    # VACO's knobs
    tv_threshold = trial.suggest_categorical("tv_threshold", list(TV_THRESHOLDS))
    vtrace_rho_bar = trial.suggest_categorical("vtrace_rho_bar", list(VTRACE_RHO_BARS))
    vtrace_c_bar = trial.suggest_categorical("vtrace_c_bar", list(VTRACE_C_BARS))
    tv_reference = trial.suggest_categorical("tv_reference", list(TV_REFERENCES))

    # Display true values
    trial.set_user_attr("gamma", 1 - one_minus_gamma)
    trial.set_user_attr("n_steps", 2**n_steps_pow)
    trial.set_user_attr("batch_size", 2**batch_size_pow)

    buffer_size = 2**n_steps_pow * n_envs
    if 2**batch_size_pow > buffer_size:
        raise optuna.TrialPruned(
            f"batch_size={2**batch_size_pow} > n_steps * n_envs = {buffer_size}: VACO needs a minibatch within the rollout"
        )

    return convert_vaco_params(
        {
            "n_steps_pow": n_steps_pow,
            "batch_size_pow": batch_size_pow,
            "one_minus_gamma": one_minus_gamma,
            "one_minus_gae_lambda": one_minus_gae_lambda,
            "learning_rate": learning_rate,
            "ent_coef": ent_coef,
            "n_epochs": n_epochs,
            "max_grad_norm": max_grad_norm,
            "net_arch": net_arch,
            "activation_fn": activation_fn,
            "tv_threshold": tv_threshold,
            "vtrace_rho_bar": vtrace_rho_bar,
            "vtrace_c_bar": vtrace_c_bar,
            "tv_reference": tv_reference,
        }
    )


def sample_lagged_ppo_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """
    Sampler for LaggedPPO: exactly the zoo's PPO space (``policy_lag`` stays as set in the YAML entry or ``-params``).

    :param trial: the Optuna trial
    :param n_actions: number of actions
    :param n_envs: number of training environments
    :param additional_args: extra arguments from the zoo
    :return: keyword arguments for :class:`~sb3_vaco.LaggedPPO`
    """
    return sample_ppo_params(trial, n_actions, n_envs, additional_args)


HYPERPARAMS_SAMPLER = {"vaco": sample_vaco_params, "lagged_ppo": sample_lagged_ppo_params}
HYPERPARAMS_CONVERTER = {"vaco": convert_vaco_params, "lagged_ppo": convert_onpolicy_params}
