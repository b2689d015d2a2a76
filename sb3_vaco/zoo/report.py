"""
A readable report of an Optuna study run with ``train -optimize``: the exact command, the fixed hyperparameters,
the best trial (raw parameters and the converted hyperparameters for a YAML entry) and every trial.

.. code-block:: bash

    python -m sb3_vaco.zoo optuna_report --storage results/optuna/study.log --study-name my-study --algo vaco \\
        -o results/optuna/my-study
"""

import argparse
import pickle
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from sb3_vaco.zoo.exp_manager import ZooUsageError


def load_study(storage: str, study_name: str) -> optuna.Study:
    """
    Load a study from a journal file (``*.log``, as the zoo writes it) or an RDB URL.

    :param storage: the ``--storage`` given to ``train -optimize``
    :param study_name: the ``--study-name`` given to ``train -optimize``
    :raises ZooUsageError: if the journal or the study does not exist
    """
    if storage.endswith(".log"):
        if not Path(storage).is_file():
            raise ZooUsageError(f"no Optuna journal at {storage}")
        optuna_storage: Any = JournalStorage(JournalFileBackend(storage))
    else:
        optuna_storage = storage
    try:
        return optuna.load_study(storage=optuna_storage, study_name=study_name)
    except KeyError as error:
        names = [summary.study_name for summary in optuna.get_all_study_summaries(optuna_storage)]
        raise ZooUsageError(f"no study {study_name!r} in {storage} (studies: {', '.join(names) or 'none'})") from error


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return str(value)


def _converted(algo: str | None, trial: FrozenTrial) -> dict[str, Any] | None:
    if algo is None:
        return None
    from rl_zoo3.hyperparams_opt import HYPERPARAMS_CONVERTER

    from sb3_vaco.zoo import register_algos

    register_algos()
    return HYPERPARAMS_CONVERTER[algo](trial.params)


def _python_literal(value: Any) -> str:
    """``value`` as the zoo's YAML writes Python objects: ``dict(...)`` for dicts, ``nn.<Name>`` for torch modules."""
    if isinstance(value, dict):
        return "dict(" + ", ".join(f"{key}={_python_literal(item)}" for key, item in value.items()) + ")"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_python_literal(item) for item in value) + "]"
    if isinstance(value, type):
        return (
            f"nn.{value.__name__}" if value.__module__.startswith("torch.nn") else f"{value.__module__}.{value.__qualname__}"
        )
    return repr(value)


def yaml_entry(hyperparams: dict[str, Any]) -> str:
    """Hyperparameters as a YAML entry in the zoo's style (``policy_kwargs: "dict(...)"``)."""
    entry = {
        key: _python_literal(value) if key == "policy_kwargs" and isinstance(value, dict) else value
        for key, value in sorted(hyperparams.items())
    }
    return yaml.safe_dump(entry, sort_keys=False, default_flow_style=False)


def study_report(study: optuna.Study, algo: str | None = None) -> str:
    """
    The study as Markdown.

    :param study: a study created by ``train -optimize``
    :param algo: the zoo algorithm, to show the best trial's converted hyperparameters (None: raw params only)
    """
    trials = study.get_trials(deepcopy=False)
    counts = {
        state.name.lower(): sum(t.state == state for t in trials)
        for state in TrialState
        if any(t.state == state for t in trials)
    }
    fixed = {key: value for key, value in study.user_attrs.items() if key != "command"}
    lines = [
        f"# Optuna study `{study.study_name}`",
        "",
        "Command:",
        "",
        "```bash",
        str(study.user_attrs.get("command", "(not recorded)")),
        "```",
        "",
        f"Trials: {len(trials)} ({', '.join(f'{n} {state}' for state, n in counts.items())}). "
        "Value: mean episodic return of the last evaluation of the trial (deterministic policy).",
        "",
    ]
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    if completed:
        best = study.best_trial
        lines += [f"## Best trial: #{best.number}, value {best.value:.6g}", "", "Sampled parameters:", ""]
        lines += [f"* `{key}`: {_format(value)}" for key, value in best.params.items()]
        converted = _converted(algo, best)
        if converted is not None:
            lines += [
                "",
                "As a YAML entry (merged over the fixed hyperparameters below):",
                "",
                "```yaml",
                yaml_entry(converted).rstrip(),
                "```",
            ]
    else:
        lines += ["## No completed trial", ""]
    if fixed:
        lines += ["", "## Fixed hyperparameters (YAML entry and -params)", ""]
        lines += [f"* `{key}`: {value}" for key, value in sorted(fixed.items())]
    param_names = sorted({name for t in trials for name in t.params})
    lines += ["", "## All trials", "", "| # | state | value | evaluations | " + " | ".join(param_names) + " |"]
    lines.append("|" + "---|" * (4 + len(param_names)))
    for trial in trials:
        value = "" if trial.value is None else f"{trial.value:.6g}"
        row = [str(trial.number), trial.state.name.lower(), value, str(len(trial.intermediate_values))]
        row += [_format(trial.params[name]) if name in trial.params else "" for name in param_names]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_report(study: optuna.Study, output: str, algo: str | None = None) -> list[Path]:
    """
    Write ``<output>.md`` (the report) and ``<output>.csv`` (``study.trials_dataframe()``).

    :return: the paths written
    """
    prefix = Path(output)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    markdown, csv = prefix.with_name(prefix.name + ".md"), prefix.with_name(prefix.name + ".csv")
    markdown.write_text(study_report(study, algo))
    study.trials_dataframe().to_csv(csv)
    return [markdown, csv]


def main() -> None:
    """``optuna_report``: command-line entry (reads ``sys.argv``)."""
    parser = argparse.ArgumentParser(description="Write a Markdown/CSV report of an Optuna study from train -optimize")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--storage", type=str, help="Journal file (*.log) or RDB URL given to train --storage")
    source.add_argument("--pkl", type=str, help="The report_*.pkl written by train -optimize")
    parser.add_argument("--study-name", type=str, help="Study name (with --storage)")
    parser.add_argument("--algo", type=str, default=None, help="Zoo algorithm, to convert the best trial's parameters")
    parser.add_argument("-o", "--output", type=str, required=True, help="Output prefix: writes <prefix>.md and <prefix>.csv")
    args = parser.parse_args()
    if args.storage is not None:
        if args.study_name is None:
            parser.error("--study-name is required with --storage")
        study = load_study(args.storage, args.study_name)
    else:
        with open(args.pkl, "rb") as file:
            study = pickle.load(file)
    for path in write_report(study, args.output, args.algo):
        print(f"Wrote {path}")
