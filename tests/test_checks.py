"""Bad hyperparameters, table-driven over every algorithm: a ValueError that names the parameter, before training."""

import inspect
import math

import pytest
from conftest import ALGORITHMS

from sb3_vaco.common.checks import HYPERPARAMETERS, Rule, check_hyperparameters


def constructor_arguments(algo: type) -> set[str]:
    """The keyword arguments ``algo`` takes, its parents' included (for classes that pass ``**kwargs`` on)."""
    return {name for cls in algo.__mro__ if "__init__" in vars(cls) for name in inspect.signature(cls.__init__).parameters}


def bad_values(rule: Rule) -> list[object]:
    """Values the rule must reject: the wrong type, NaN and infinities, and the nearest values out of range."""
    values: list[object] = ["x", math.nan, math.inf, -math.inf, True, [1]]
    if not rule.schedule:
        values.append(lambda progress: 0.1)
    if not rule.optional:
        values.append(None)
    if rule.integer:
        values.append(2.5)
    if rule.low is not None:
        values.append(rule.low if rule.low_open else rule.low - 1)
    if rule.high is not None:
        values.append(rule.high if rule.high_open else rule.high + 0.5)
    return values


CASES = [
    (algo, name, value)
    for algo in ALGORITHMS
    for name in sorted(set(HYPERPARAMETERS) & constructor_arguments(algo))
    for value in bad_values(HYPERPARAMETERS[name])
]


def test_every_algorithm_has_its_numeric_parameters_in_the_table():
    assert len(CASES) > 500
    for algo in ALGORITHMS:
        assert {"learning_rate", "gamma", "n_steps", "max_grad_norm"} <= constructor_arguments(algo) & set(HYPERPARAMETERS)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_bad_values_name_the_parameter(env_id):
    """Every bad value of every numeric parameter of every algorithm fails at construction, naming the parameter."""
    unclear = []
    for algo, name, value in CASES:
        try:
            algo("MlpPolicy", env_id, **{name: value})
        except ValueError as error:
            if f"`{name}`" not in str(error):
                unclear.append(f"{algo.__name__}({name}={value!r}): {error}")
        else:
            unclear.append(f"{algo.__name__}({name}={value!r}) was accepted")
    assert not unclear, "\n".join(unclear[:20])


def test_good_values_pass():
    check_hyperparameters({"learning_rate": lambda progress: 3e-4 * progress, "batch_size": None, "gamma": 1, "ent_coef": 0})
    check_hyperparameters({"clip_range_vf": None, "target_kl": 0.02, "sde_sample_freq": -1, "kl_coef": 0.0})
    check_hyperparameters({"not_a_hyperparameter": "anything"})
    with pytest.raises(ValueError, match=r"`gamma` must be a finite number >= 0 and <= 1; got 1\.5"):
        check_hyperparameters({"gamma": 1.5})
