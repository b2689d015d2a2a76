"""
Optuna search spaces for ``-optimize`` and the converters that turn a stored trial back into hyperparameters
(``--trial-id``), registered into rl_zoo3's ``HYPERPARAMS_SAMPLER`` / ``HYPERPARAMS_CONVERTER`` by
:func:`sb3_vaco.zoo.register_algos`.
"""

from typing import Any

import optuna
from rl_zoo3.hyperparams_opt import convert_onpolicy_params, sample_ppo_params, sample_trpo_params

from sb3_vaco.vaco.vaco import TV_REFERENCES

# VACO's own knobs, sampled on top of the PPO space (categorical, like the zoo's clip_range)
TV_THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.5)
VTRACE_RHO_BARS = (0.5, 1.0, 2.0)
VTRACE_C_BARS = (0.5, 1.0)
# PPOKL's β
KL_COEFS = (0.1, 0.3, 1.0, 3.0)


def _sample_ppo_space(trial: optuna.Trial, n_envs: int, algo: str, minibatches: bool = True) -> dict[str, Any]:
    """
    The zoo's PPO search space (:func:`rl_zoo3.hyperparams_opt.sample_ppo_params`: same names, ranges and choices,
    checked by tests/test_zoo.py) without ``clip_range``, as the raw parameters the converter takes. A ``batch_size``
    larger than the rollout (``n_steps * n_envs``), which the lagged algorithms reject, prunes the trial at once,
    before any environment is created.

    :param trial: the Optuna trial
    :param n_envs: number of training environments
    :param algo: the algorithm's name, for the pruning message
    :param minibatches: whether to sample ``batch_size`` and ``n_epochs`` (False: one pass over the whole batch)
    :return: the sampled parameters, before :func:`~rl_zoo3.hyperparams_opt.convert_onpolicy_params`
    """
    params: dict[str, Any] = {}
    if minibatches:
        params["batch_size_pow"] = trial.suggest_int("batch_size_pow", 2, 10)
    params["n_steps_pow"] = trial.suggest_int("n_steps_pow", 5, 12)
    params["one_minus_gamma"] = trial.suggest_float("one_minus_gamma", 0.0001, 0.03, log=True)
    params["one_minus_gae_lambda"] = trial.suggest_float("one_minus_gae_lambda", 0.0001, 0.1, log=True)
    params["learning_rate"] = trial.suggest_float("learning_rate", 1e-5, 0.002, log=True)
    params["ent_coef"] = trial.suggest_float("ent_coef", 0.00000001, 0.1, log=True)
    if minibatches:
        params["n_epochs"] = trial.suggest_categorical("n_epochs", [1, 5, 10, 20])
    params["max_grad_norm"] = trial.suggest_float("max_grad_norm", 0.3, 2)
    params["net_arch"] = trial.suggest_categorical("net_arch", ["tiny", "small", "medium"])
    params["activation_fn"] = trial.suggest_categorical("activation_fn", ["tanh", "relu"])

    # Display true values
    trial.set_user_attr("gamma", 1 - params["one_minus_gamma"])
    trial.set_user_attr("n_steps", 2 ** params["n_steps_pow"])
    if minibatches:
        trial.set_user_attr("batch_size", 2 ** params["batch_size_pow"])
        buffer_size = 2 ** params["n_steps_pow"] * n_envs
        if 2 ** params["batch_size_pow"] > buffer_size:
            raise optuna.TrialPruned(
                f"batch_size={2 ** params['batch_size_pow']} > n_steps * n_envs = {buffer_size}: "
                f"{algo} needs a minibatch within the rollout"
            )
    return params


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
    params = _sample_ppo_space(trial, n_envs, "VACO")
    params["tv_threshold"] = trial.suggest_categorical("tv_threshold", list(TV_THRESHOLDS))
    params["vtrace_rho_bar"] = trial.suggest_categorical("vtrace_rho_bar", list(VTRACE_RHO_BARS))
    params["vtrace_c_bar"] = trial.suggest_categorical("vtrace_c_bar", list(VTRACE_C_BARS))
    params["tv_reference"] = trial.suggest_categorical("tv_reference", list(TV_REFERENCES))
    return convert_onpolicy_params(params)  # VACO's own keys are constructor arguments: they pass through


def sample_clipped_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """
    Sampler for DecoupledPPO and APPO: the zoo's PPO space, ``clip_range`` included (each clips its own ratio
    with it), with the same pruning of minibatches larger than the rollout as VACO's.

    :param trial: the Optuna trial
    :param n_actions: number of actions (unused)
    :param n_envs: number of training environments
    :param additional_args: extra arguments from the zoo (unused)
    :return: keyword arguments for :class:`~sb3_vaco.DecoupledPPO` or :class:`~sb3_vaco.APPO`
    """
    params = _sample_ppo_space(trial, n_envs, "this algorithm")
    params["clip_range"] = trial.suggest_categorical("clip_range", [0.1, 0.2, 0.3, 0.4])
    return convert_onpolicy_params(params)


def sample_ppo_kl_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """
    Sampler for PPOKL: the zoo's PPO space without ``clip_range`` (PPOKL does not clip), plus the penalty's β
    (``kl_coef``).

    :param trial: the Optuna trial
    :param n_actions: number of actions (unused)
    :param n_envs: number of training environments
    :param additional_args: extra arguments from the zoo (unused)
    :return: keyword arguments for :class:`~sb3_vaco.PPOKL`
    """
    params = _sample_ppo_space(trial, n_envs, "PPOKL")
    params["kl_coef"] = trial.suggest_categorical("kl_coef", list(KL_COEFS))
    return convert_onpolicy_params(params)


def sample_impala_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """
    Sampler for IMPALA: the zoo's PPO space without what IMPALA does not have (``clip_range``, and ``batch_size``
    and ``n_epochs``: one SGD pass over the whole batch), plus V-trace's truncations ρ̄ and c̄ (the same choices as
    VACO's) and whether to normalize the advantages.

    :param trial: the Optuna trial
    :param n_actions: number of actions (unused)
    :param n_envs: number of training environments
    :param additional_args: extra arguments from the zoo (unused)
    :return: keyword arguments for :class:`~sb3_vaco.IMPALA`
    """
    params = _sample_ppo_space(trial, n_envs, "IMPALA", minibatches=False)
    params["vtrace_rho_bar"] = trial.suggest_categorical("vtrace_rho_bar", list(VTRACE_RHO_BARS))
    params["vtrace_c_bar"] = trial.suggest_categorical("vtrace_c_bar", list(VTRACE_C_BARS))
    params["normalize_advantage"] = trial.suggest_categorical("normalize_advantage", [False, True])
    return convert_onpolicy_params(params)


# LaggedPPO and LaggedTRPO take exactly the zoo's PPO and TRPO spaces (``policy_lag`` stays as set in the YAML entry
# or ``-params``)
HYPERPARAMS_SAMPLER = {
    "vaco": sample_vaco_params,
    "lagged_ppo": sample_ppo_params,
    "decoupled_ppo": sample_clipped_params,
    "appo": sample_clipped_params,
    "ppo_kl": sample_ppo_kl_params,
    "impala": sample_impala_params,
    "lagged_trpo": sample_trpo_params,
}
HYPERPARAMS_CONVERTER = {name: convert_onpolicy_params for name in HYPERPARAMS_SAMPLER}
