"""
GRPO vs GRPO+VACO for math reasoning under policy lag (the LLM experiment of arXiv 2603.01365, in miniature).

Default (runs on CPU, no downloads): a tiny Llama-architecture model built from a config, generated
grade-school-style word problems with an exact-answer reward, a supervised warm-up per seed on demonstrations of
which half show a near miss, then GRPO (TRL's clipped loss) and GRPO+VACO in each of its forms (token, sequence,
decoupled; δ = --tv-threshold) at lags 0 and 32, 5 seeds, 400 steps, with the held-out accuracy (greedy and sampled
pass@1) during training. Writes ``summary.csv`` (one row per run: start and final accuracy), ``runs.csv`` (accuracy
curves), ``train_log.csv`` (TRL's metrics), ``summary.md`` (the gains, with CIs), ``accuracy.png`` and
``config.json`` to ``--out`` (about 70 min on one thread; docs/llm.md has the results):

    OMP_NUM_THREADS=1 python scripts/llm_gsm_demo.py --out results/llm_demo

With a local model folder and GSM8K-format files (GPU; see docs/llm.md):

    python scripts/llm_gsm_demo.py --model models/qwen --dataset data/gsm8k/train.jsonl \\
        --eval-dataset data/gsm8k/test.jsonl --warmup-steps 0 --max-completion-length 256 --bf16 ...
"""

import argparse
import copy
import csv
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch as th
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback
from transformers.trainer_callback import PrinterCallback

from sb3_vaco.llm import VACO_FORMS, VACOGRPOConfig, VACOGRPOTrainer
from vaco_lab.math_task import (
    Problem,
    build_tiny_model,
    build_tokenizer,
    evaluate_accuracy,
    exact_answer_reward,
    load_gsm8k,
    make_word_problems,
    supervised_warmup,
)

#: The trainer's default VACO form, which ``--methods vaco`` runs
DEFAULT_FORM: str = VACOGRPOConfig.vaco_form

#: TRL's own remedies for stale generations (``--methods``), each with TRL's recommended settings (``docs/llm.md``
#: says where each comes from), run on the stale actor as TRL runs them on vLLM's generations: the ratio to the learner
#: at generation, off-policy masking on the KL to the stale actor, TRL's default sampler-mismatch correction
TRL_REMEDIES: dict[str, tuple[str, dict[str, Any]]] = {
    "mis": ("GRPO + TRL's sampler correction (sequence MIS, C=3)", {"loss_type": "dapo"}),
    "opsm": ("GRPO + off-policy sequence masking", {"loss_type": "dapo", "off_policy_mask_threshold": 0.5}),
    "cispo": ("CISPO (ε_max=5)", {"loss_type": "cispo", "epsilon_high": 5.0}),
    "sapo": ("SAPO (τ+=1, τ−=1.05)", {"loss_type": "sapo", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05}),
    "gspo": (
        "GSPO (ε=3e-4, 4e-4)",
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    ),
    "vespo": ("VESPO", {"loss_type": "vespo", "vllm_importance_sampling_mode": "token_truncate"}),
}

#: The methods of ``--methods`` (each VACO form also as ``vaco_<form>@<δ>``, ``opsm`` as ``opsm@<δ>``); ``vaco`` is
#: ``vaco_<DEFAULT_FORM>``
METHODS = ("grpo", *(f"vaco_{form}" for form in VACO_FORMS), *TRL_REMEDIES)

#: ``--lags`` labels besides a number of optimizer steps: generation one batch ahead of training
ASYNC_LAG = "async"


class Method(NamedTuple):
    """A method of ``--methods``: its canonical name, TRL loss type, VACO form, TV budget, plot label, TRL settings."""

    name: str
    loss_type: str
    form: str
    tv_threshold: float
    label: str
    settings: Mapping[str, Any] = MappingProxyType({})


def parse_method(method: str, args: argparse.Namespace) -> Method:
    """
    ``"grpo"`` (TRL's default loss, ``"dapo"``, clipped at ε, its ratio taken to the generating policy),
    ``"vaco_<form>"`` (the VACO form at ``--tv-threshold``; ``"vaco"`` is the trainer's default form),
    ``"vaco_<form>@δ"`` (at δ), or one of TRL's remedies (:data:`TRL_REMEDIES`; ``"opsm@δ"``: masking at δ).
    """
    name, at, threshold = method.partition("@")
    if name == "grpo" and not at:
        settings: dict[str, Any] = {"loss_type": "dapo", "stale_actor_as": "old_policy"}
        return Method("grpo", "dapo", "", math.nan, f"GRPO (TRL default loss, clip ε={args.epsilon})", settings)
    if name in TRL_REMEDIES and (not at or name == "opsm"):
        label, settings = TRL_REMEDIES[name]
        if at:
            settings = settings | {"off_policy_mask_threshold": float(threshold)}
        if name == "opsm":
            label = f"{label} (δ={settings['off_policy_mask_threshold']})"
        return Method(method, settings["loss_type"], "", math.nan, label, settings)
    name, drift, variant = name.partition("+")
    name = f"vaco_{DEFAULT_FORM}" if name == "vaco" else name
    if name not in METHODS[1 : 1 + len(VACO_FORMS)] or (drift and (variant, name) != ("drift", "vaco_sequence")):
        raise ValueError(
            f"unknown method {method!r}: use one of {', '.join(METHODS)}, optionally with @<δ> for VACO and opsm, "
            "or vaco_sequence+drift"
        )
    tv_threshold = float(threshold) if at else args.tv_threshold
    form = name.removeprefix("vaco_")
    name = f"{name}+drift" if drift else name
    canonical = f"{name}@{threshold}" if at else name
    label = f"GRPO+VACO ({form} form{', drift test' if drift else ''}, δ={tv_threshold})"
    return Method(canonical, "vaco", form, tv_threshold, label, {"filter_drift": True} if drift else {})


def parse_lag(label: str) -> int | str:
    """A ``--lags`` item: a number of optimizer steps, or ``"async"`` (generation one batch ahead of training)."""
    if label == ASYNC_LAG:
        return label
    try:
        lag = int(label)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a lag is a number of optimizer steps or {ASYNC_LAG!r}, got {label!r}") from None
    if lag < 0:
        raise argparse.ArgumentTypeError(f"a lag is >= 0, got {lag}")
    return lag


def lag_order(lag: int | str) -> tuple[int, int]:
    """Sort key of lag labels: the numbers in order, then ``"async"``."""
    return (1, 0) if isinstance(lag, str) else (0, lag)


LOG_KEYS = (
    "reward",
    "policy_lag",
    "generation_lag",
    "tv_behavior",
    "tv_estimate",
    "tv_to_behavior",
    "filtered_fraction",
    "filter_active_fraction",
    "clip_ratio/region_mean",
    "importance_weight",
    "sampler_correction",
    "off_policy_mask/dropped_fraction",
    "cispo_clip_ratio",
    "vespo/phi_seq_mean",
    "entropy",
)

#: Columns of summary.csv, one row per run (empty: not measured, e.g. sampled accuracy with --eval-samples 0)
SUMMARY_COLUMNS = (
    "method",
    "lag",
    "seed",
    "start_accuracy",
    "final_accuracy",
    "accuracy_kind",
    "start_accuracy_greedy",
    "final_accuracy_greedy",
    "last3_accuracy_greedy",
    "start_accuracy_sampled",
    "final_accuracy_sampled",
    "last3_accuracy_sampled",
    "loss_type",
    "vaco_form",
    "tv_threshold",
    "steps",
    "policy_lag",
    "tv_behavior",
    "clip_fraction",
    "filtered_fraction",
    "importance_weight",
    "wall_s",
    "sampler_correction",
    "off_policy_dropped_fraction",
    "cispo_clip_fraction",
    "vespo_weight",
    "settings",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/llm_demo"))
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS[: 1 + len(VACO_FORMS)]),
        help=f"{', '.join(METHODS)} (δ = --tv-threshold), or vaco_<form>@<δ>, opsm@<δ>, "
        f"vaco_sequence+drift[@<δ>] (the TV test on π_θ/μ); vaco = vaco_{DEFAULT_FORM} (default: GRPO and the VACO forms)",
    )
    parser.add_argument(
        "--lags",
        "--lag",
        nargs="+",
        type=parse_lag,
        default=[0, 32],
        help=f"policy lags K in optimizer steps, or {ASYNC_LAG!r}: each batch generated while the previous one trains",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    # model and data
    parser.add_argument(
        "--model", type=Path, default=None, help="local model folder (save_pretrained; default: tiny model from a config)"
    )
    parser.add_argument("--dataset", type=Path, default=None, help="local GSM8K-format file/dir (default: generated)")
    parser.add_argument("--eval-dataset", type=Path, default=None, help="local GSM8K-format test file/dir")
    parser.add_argument("--n-train", type=int, default=20000, help="generated training problems")
    parser.add_argument("--n-eval", type=int, default=500, help="held-out problems for the accuracy (at most)")
    parser.add_argument("--max-number", type=int, default=9)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    # warm-up
    parser.add_argument("--warmup-steps", type=int, default=600, help="supervised warm-up steps (0: none)")
    parser.add_argument("--warmup-lr", type=float, default=3e-3)
    parser.add_argument(
        "--warmup-answer-noise",
        type=float,
        default=0.5,
        help="share of warm-up demonstrations showing a near miss (±1, ±2) instead of the gold answer",
    )
    # RL
    parser.add_argument("--max-steps", type=int, default=400, help="optimizer steps of RL")
    parser.add_argument("--learning-rate", type=float, default=4e-4)
    parser.add_argument("--batch-size", type=int, default=128, help="per-device train batch (completions)")
    parser.add_argument("--steps-per-generation", type=int, default=4)
    parser.add_argument("--num-iterations", type=int, default=1)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--epsilon", type=float, default=0.2, help="GRPO's clip range")
    parser.add_argument("--tv-threshold", type=float, default=0.2, help="VACO's δ")
    parser.add_argument(
        "--rho-bar",
        type=float,
        default=None,
        help="truncation of π_T/μ (default: the form's, 2 for sequence, 1 for decoupled)",
    )
    parser.add_argument(
        "--importance-sampling-level",
        default="token",
        choices=["token", "sequence"],
        help="ratio per token or per completion (GRPO and the token / decoupled forms; the sequence form is per token)",
    )
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-temperature", type=float, default=1.0, help="temperature of the sampled pass@1")
    parser.add_argument("--eval-samples", type=int, default=2, help="completions per problem for sampled pass@1 (0: off)")
    parser.add_argument(
        "--accuracy",
        default=None,
        choices=["greedy", "sampled"],
        help="the accuracy in summary.csv's start_accuracy, final_accuracy (default: sampled; greedy if --eval-samples 0)",
    )
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="TRL's default; off for the tiny model")
    parser.add_argument(
        "--summarize-only",
        action="store_true",
        help="train nothing: rewrite summary.md and accuracy.png from the CSV files in --out",
    )
    parser.add_argument(
        "--merge-from",
        nargs="+",
        type=Path,
        default=[],
        help="train nothing: add the runs in these output folders (e.g. seeds or methods run as separate processes) "
        "to the CSV files in --out, replacing runs of the same method, lag and seed, then summarize",
    )
    args = parser.parse_args(argv)
    if args.accuracy is None:
        args.accuracy = "sampled" if args.eval_samples > 0 else "greedy"
    return args


class AccuracyCallback(TrainerCallback):
    """Exact-answer accuracy on the held-out problems every ``every`` optimizer steps: greedy, and sampled pass@1."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, problems: list[Problem], args: argparse.Namespace) -> None:
        self.tokenizer, self.problems, self.args = tokenizer, problems, args
        self.every = args.eval_every
        self.curve: list[tuple[int, float, float | None]] = []

    def evaluate(self, step: int, model: PreTrainedModel) -> None:
        max_new_tokens = self.args.max_completion_length
        greedy = evaluate_accuracy(model, self.tokenizer, self.problems, max_new_tokens=max_new_tokens)
        sampled = None
        if self.args.eval_samples > 0:
            sampled = evaluate_accuracy(
                model,
                self.tokenizer,
                self.problems,
                max_new_tokens=max_new_tokens,
                temperature=self.args.eval_temperature,
                samples=self.args.eval_samples,
            )
        self.curve.append((step, greedy, sampled))

    def on_step_end(self, args: Any, state: Any, control: Any, model: PreTrainedModel | None = None, **kwargs: Any) -> None:
        if model is not None and (state.global_step % self.every == 0 or state.global_step == state.max_steps):
            self.evaluate(state.global_step, model)


def load_model_and_data(
    args: argparse.Namespace, seed: int
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, list[Problem], list[Problem]]:
    """The model (after its warm-up), its tokenizer, and the training / held-out problems."""
    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel
    if args.model is None:
        tokenizer = build_tokenizer()
        model = build_tiny_model(tokenizer, hidden_size=args.hidden_size, num_layers=args.num_layers, seed=seed)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not args.model.is_dir():
            raise FileNotFoundError(f"--model {args.model}: not a folder (save_pretrained's output is expected)")
        tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left", local_files_only=True)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        dtype = th.bfloat16 if args.bf16 else th.float32
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, local_files_only=True)
        th.manual_seed(seed)  # the warm-up and nothing else draws from it before the runs
        if th.cuda.is_available():
            model = model.to("cuda")  # type: ignore[arg-type]
    if args.dataset is None:
        train = make_word_problems(args.n_train, seed=10_000 + seed, max_number=args.max_number)
        held_out = make_word_problems(args.n_eval, seed=99, max_number=args.max_number)  # same for every seed
        train_prompts = {p["prompt"] for p in held_out}
        train = [p for p in train if p["prompt"] not in train_prompts]
    elif args.eval_dataset is not None:
        train = load_gsm8k(args.dataset)
        held_out = load_gsm8k(args.eval_dataset, limit=args.n_eval)
    else:  # hold out the file's last --n-eval problems
        train = load_gsm8k(args.dataset)
        if len(train) <= args.n_eval:
            raise ValueError(f"{args.dataset} has {len(train)} problems: pass --eval-dataset or a smaller --n-eval")
        train, held_out = train[: -args.n_eval], train[-args.n_eval :]
    if not train or not held_out:
        raise ValueError("no training or no held-out problems (answers must end with '#### <number>')")
    if args.warmup_steps > 0:
        supervised_warmup(
            model,
            tokenizer,
            train,
            args.warmup_steps,
            learning_rate=args.warmup_lr,
            seed=seed,
            answer_noise=args.warmup_answer_noise,
        )
    return model, tokenizer, train, held_out


def run_one(
    args: argparse.Namespace,
    method: Method,
    lag: int | str,
    seed: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: list[Problem],
    held_out: list[Problem],
) -> tuple[list[tuple[int, float, float | None]], list[dict[str, Any]], float]:
    """One RL run from a copy of the warmed-up model; returns the accuracy curve, TRL's log and the wall time."""
    output_dir = tempfile.TemporaryDirectory(prefix="vaco_grpo_")  # nothing is saved there (save_strategy="no")
    settings: dict[str, Any] = dict(
        output_dir=output_dir.name,
        loss_type=method.loss_type,
        vaco_form=method.form or "token",  # unused by TRL's losses
        policy_lag=0 if lag == ASYNC_LAG else lag,
        generation_ahead=1 if lag == ASYNC_LAG else 0,
        tv_threshold=args.tv_threshold if math.isnan(method.tv_threshold) else method.tv_threshold,
        rho_bar=args.rho_bar,
        importance_sampling_level="token" if method.form == "sequence" else args.importance_sampling_level,
        epsilon=args.epsilon,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        per_device_train_batch_size=args.batch_size,
        steps_per_generation=args.steps_per_generation,
        num_iterations=args.num_iterations,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        beta=0.0,
        logging_steps=args.eval_every,
        report_to="none",
        save_strategy="no",
        seed=seed,
        data_seed=seed,
        bf16=args.bf16,
        gradient_checkpointing=args.gradient_checkpointing,
        use_cpu=not th.cuda.is_available(),
        disable_tqdm=True,
    )
    config = VACOGRPOConfig(**(settings | dict(method.settings)))
    accuracy = AccuracyCallback(tokenizer, held_out, args)
    policy = copy.deepcopy(model)
    trainer = VACOGRPOTrainer(
        model=policy,
        reward_funcs=exact_answer_reward,
        args=config,
        train_dataset=Dataset.from_list(train),
        processing_class=tokenizer,
        callbacks=[accuracy],
    )
    trainer.remove_callback(PrinterCallback)  # the per-step log dicts; they are kept in train_log.csv
    accuracy.evaluate(0, policy)
    start = time.perf_counter()
    trainer.train()
    output_dir.cleanup()
    return accuracy.curve, trainer.state.log_history, time.perf_counter() - start


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def summarize(rows: list[dict[str, Any]], logs: list[dict[str, Any]]) -> str:
    """
    Markdown tables: per run (method, lag, seed) the held-out accuracy at the start, at the end and averaged over
    the last 3 evaluations, greedy and sampled, with the run's mean lag diagnostics; then mean ± sd over seeds.
    """
    lines = [
        "| method | lag K | seed | greedy start | greedy final | greedy last-3 | sampled start | sampled final "
        "| sampled last-3 | policy lag | TV(π_T, μ) | clipped / filtered |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    runs: dict[tuple[str, int | str, int], list[dict[str, Any]]] = {}
    for row in rows:
        runs.setdefault((row["method"], row["lag"], row["seed"]), []).append(row)
    aggregate: dict[tuple[str, int | str], dict[str, list[float]]] = {}
    for key, run in sorted(runs.items(), key=lambda item: (item[0][0], lag_order(item[0][1]), item[0][2])):
        run = sorted(run, key=lambda row: row["step"])
        greedy = [row["accuracy"] for row in run]
        sampled = [row["sampled_accuracy"] for row in run if row["sampled_accuracy"] is not None]
        run_logs = [log for log in logs if (log["method"], log["lag"], log["seed"]) == key]

        def logged(name: str, run_logs: list[dict[str, Any]] = run_logs) -> float:
            return _mean([log[name] for log in run_logs if log.get(name) is not None])

        masked = logged("filtered_fraction") if key[0].startswith("vaco") else logged("clip_ratio/region_mean")
        stats = aggregate.setdefault(key[:2], {"greedy": [], "sampled": []})
        stats["greedy"].append(_mean(greedy[-3:]))
        stats["sampled"].append(_mean(sampled[-3:]))
        sampled_cells = f"{sampled[0]:.3f} | {sampled[-1]:.3f} | {_mean(sampled[-3:]):.3f}" if sampled else "– | – | –"
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {greedy[0]:.3f} | {greedy[-1]:.3f} | {_mean(greedy[-3:]):.3f} | "
            f"{sampled_cells} | {logged('policy_lag'):.1f} | {logged('tv_behavior'):.3f} | {masked:.3f} |"
        )
    lines += [
        "",
        "| method | lag K | greedy last-3, mean ± sd | sampled last-3, mean ± sd | seeds |",
        "|---|---|---|---|---|",
    ]
    for (method, lag), stats in sorted(aggregate.items(), key=lambda item: (item[0][0], lag_order(item[0][1]))):
        lines.append(
            f"| {method} | {lag} | {np.mean(stats['greedy']):.3f} ± {np.std(stats['greedy']):.3f} | "
            f"{np.mean(stats['sampled']):.3f} ± {np.std(stats['sampled']):.3f} | {len(stats['greedy'])} |"
        )
    return "\n".join(lines) + "\n"


def gains_by_run(summary: list[dict[str, Any]], kind: str) -> dict[tuple[str, int | str], dict[int, float]]:
    """The ``kind`` accuracy gain (final − start) of each run: ``{(method, lag): {seed: gain}}``."""
    table: dict[tuple[str, int | str], dict[int, float]] = {}
    for row in summary:
        start, final = row[f"start_accuracy_{kind}"], row[f"final_accuracy_{kind}"]
        if start != "" and final != "":
            table.setdefault((row["method"], row["lag"]), {})[row["seed"]] = final - start
    return table


def paired_ci(
    statistic: Callable[..., np.ndarray], arrays: Sequence[np.ndarray], reps: int, rng: np.random.Generator
) -> tuple[float, float]:
    """
    95 % percentile bootstrap CI of ``statistic(*arrays)``, the seeds resampled together (paired: a seed's runs share
    its warm-up). ``statistic`` reduces over the last axis, so it gives the point estimate on the arrays themselves.
    """
    samples = rng.integers(len(arrays[0]), size=(reps, len(arrays[0])))
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = statistic(*(array[samples] for array in arrays))
    low, high = np.nanpercentile(boot, [2.5, 97.5])
    return float(low), float(high)


def gains(summary: list[dict[str, Any]], kind: str, reps: int = 2000, seed: int = 0) -> str:
    """
    A markdown table of what RL gains in ``kind`` accuracy (``"greedy"`` or ``"sampled"``): per method and lag the mean gain
    ``final − start`` over seeds, the share of its own lag-0 gain it keeps, and (at lag 0) its gain over GRPO's, each
    ratio of means with a 95 % percentile bootstrap CI over seeds (paired: a seed's runs share its warm-up).
    """
    table = gains_by_run(summary, kind)
    if not table:
        return ""
    rng = np.random.default_rng(seed)

    def ratio(numerator: dict[int, float], denominator: dict[int, float]) -> str:
        seeds = sorted(set(numerator) & set(denominator))
        x, y = (np.array([values[s] for s in seeds]) for values in (numerator, denominator))
        if not seeds or y.mean() == 0:
            return "–"
        if len(seeds) == 1:
            return f"{x.mean() / y.mean():.2f}"
        low, high = paired_ci(lambda x, y: x.mean(axis=-1) / y.mean(axis=-1), [x, y], reps, rng)
        return f"{x.mean() / y.mean():.2f} [{low:.2f}, {high:.2f}]"

    lines = [
        f"Gain = final − start {kind} accuracy; ratios of mean gains, 95 % bootstrap CI over seeds (paired).",
        "",
        "| method | lag K | gain, mean ± sd | seeds | kept of own lag-0 gain | lag-0 gain / GRPO's |",
        "|---|---|---|---|---|---|",
    ]
    for (method, lag), values in sorted(table.items(), key=lambda item: (item[0][0], lag_order(item[0][1]))):
        own = table.get((method, 0), {})
        grpo = table.get(("grpo", 0), {})
        kept = ratio(values, own) if lag != 0 else "–"
        versus = ratio(values, grpo) if lag == 0 and method != "grpo" else "–"
        gain = np.array(list(values.values()))
        lines.append(f"| {method} | {lag} | {gain.mean():+.3f} ± {gain.std():.3f} | {len(gain)} | {kept} | {versus} |")
    return "\n".join(lines) + "\n"


def paired_verdict(low: float, high: float, reference: str, method: str, verb: str) -> str:
    """The verdict a 95 % CI ``[low, high]`` of ``reference − method`` supports: who ``verb``s more, or neither."""
    if low > 0:
        return f"{reference} {verb} more"
    if high < 0:
        return f"{method} {verb} more"
    return "no significant difference"


def kept_against(summary: list[dict[str, Any]], kind: str, reference: str, reps: int = 2000, seed: int = 0) -> str:
    """
    A markdown table: at each lag, the share of its own lag-0 gain that ``reference`` keeps minus the share each other
    method keeps, with a 95 % percentile bootstrap CI over the seeds both ran (paired: a seed's runs share its warm-up)
    and a verdict from the CI.
    """
    gain = gains_by_run(summary, kind)
    lags = sorted({lag for _, lag in gain if lag != 0 and (reference, lag) in gain}, key=lag_order)
    methods = sorted({method for method, _ in gain if method != reference})
    rng = np.random.default_rng(seed)
    lines = [
        f"Share of its own lag-0 {kind} gain that {reference} keeps minus the share each method keeps (> 0: "
        f"{reference} keeps more); 95 % bootstrap CI over the seeds both ran (paired).",
        "",
        f"| lag K | method | {reference} keeps | method keeps | difference | seeds | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for lag in lags:
        for method in methods:
            tables = [gain.get(key, {}) for key in ((reference, lag), (reference, 0), (method, lag), (method, 0))]
            seeds = sorted(set.intersection(*(set(table) for table in tables)))
            if len(seeds) < 2:
                continue
            ref_lag, ref_0, lag_gain, zero_gain = (np.array([table[s] for s in seeds]) for table in tables)
            low, high = paired_ci(
                lambda a, b, c, d: a.mean(axis=-1) / b.mean(axis=-1) - c.mean(axis=-1) / d.mean(axis=-1),
                [ref_lag, ref_0, lag_gain, zero_gain],
                reps,
                rng,
            )
            point_ref, point = ref_lag.mean() / ref_0.mean(), lag_gain.mean() / zero_gain.mean()
            verdict = paired_verdict(low, high, reference, method, "keeps")
            lines.append(
                f"| {lag} | {method} | {point_ref:.2f} | {point:.2f} | {point_ref - point:+.2f} [{low:+.2f}, {high:+.2f}] "
                f"| {len(seeds)} | {verdict} |"
            )
    return "\n".join(lines) + "\n" if len(lines) > 4 else ""


def gain_against(summary: list[dict[str, Any]], kind: str, reference: str, reps: int = 2000, seed: int = 0) -> str:
    """
    A markdown table: at each lag (0 included), ``reference``'s ``kind`` accuracy gain minus each other method's, mean
    over the seeds both ran with a 95 % percentile bootstrap CI (paired: a seed's runs share its warm-up) and a verdict.
    """
    gain = gains_by_run(summary, kind)
    lags = sorted({lag for method, lag in gain if method == reference}, key=lag_order)
    methods = sorted({method for method, _ in gain if method != reference})
    rng = np.random.default_rng(seed)
    lines = [
        f"{reference}'s {kind} gain minus each method's at the same lag (> 0: {reference} gains more); 95 % bootstrap "
        "CI over the seeds both ran (paired).",
        "",
        "| lag K | method | difference | seeds | verdict |",
        "|---|---|---|---|---|",
    ]
    for lag in lags:
        for method in methods:
            ours, theirs = gain[(reference, lag)], gain.get((method, lag), {})
            seeds = sorted(set(ours) & set(theirs))
            if len(seeds) < 2:
                continue
            difference = np.array([ours[s] - theirs[s] for s in seeds])
            low, high = paired_ci(lambda d: d.mean(axis=-1), [difference], reps, rng)
            verdict = paired_verdict(low, high, reference, method, "gains")
            lines.append(
                f"| {lag} | {method} | {difference.mean():+.3f} [{low:+.3f}, {high:+.3f}] | {len(seeds)} | {verdict} |"
            )
    return "\n".join(lines) + "\n" if len(lines) > 4 else ""


def summary_row(
    args: argparse.Namespace,
    method: Method,
    lag: int | str,
    seed: int,
    curve: list[tuple[int, float, float | None]],
    run_logs: list[dict[str, Any]],
    wall: float,
) -> dict[str, Any]:
    """One row of summary.csv (``SUMMARY_COLUMNS``): accuracies before RL (after the warm-up) and at the last step."""

    def cell(value: float | None) -> float | str:
        return "" if value is None or math.isnan(value) else round(value, 4)

    def logged(name: str) -> float | str:
        return cell(_mean([log[name] for log in run_logs if log.get(name) is not None]))

    greedy = [a for _, a, _ in curve]
    sampled = [p for _, _, p in curve if p is not None]
    headline = greedy if args.accuracy == "greedy" else sampled
    return {
        "method": method.name,
        "lag": lag,
        "seed": seed,
        "start_accuracy": cell(headline[0]),
        "final_accuracy": cell(headline[-1]),
        "accuracy_kind": args.accuracy,
        "start_accuracy_greedy": cell(greedy[0]),
        "final_accuracy_greedy": cell(greedy[-1]),
        "last3_accuracy_greedy": cell(_mean(greedy[-3:])),
        "start_accuracy_sampled": cell(sampled[0] if sampled else None),
        "final_accuracy_sampled": cell(sampled[-1] if sampled else None),
        "last3_accuracy_sampled": cell(_mean(sampled[-3:])),
        "loss_type": method.loss_type,
        "vaco_form": method.form,
        "tv_threshold": cell(method.tv_threshold),
        "steps": curve[-1][0],
        "policy_lag": logged("policy_lag"),
        "tv_behavior": logged("tv_behavior"),
        "clip_fraction": logged("clip_ratio/region_mean"),
        "filtered_fraction": logged("filtered_fraction"),
        "importance_weight": logged("importance_weight"),
        "wall_s": round(wall, 1),
        "sampler_correction": logged("sampler_correction"),
        "off_policy_dropped_fraction": logged("off_policy_mask/dropped_fraction"),
        "cispo_clip_fraction": logged("cispo_clip_ratio"),
        "vespo_weight": logged("vespo/phi_seq_mean"),
        "settings": json.dumps(dict(method.settings), sort_keys=True) if method.settings else "",
    }


def plot(rows: list[dict[str, Any]], args: argparse.Namespace, methods: list[Method], path: Path) -> None:
    """Accuracy curves (greedy, sampled), one panel per lag: mean over seeds with the seeds' min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("accuracy", "greedy accuracy")]
    if any(row["sampled_accuracy"] is not None for row in rows):
        metrics.append(("sampled_accuracy", f"sampled pass@1 (T={args.eval_temperature})"))
    size = (5 * len(args.lags), 3.4 * len(metrics))
    fig, axes = plt.subplots(len(metrics), len(args.lags), figsize=size, sharex=True, sharey="row", squeeze=False)
    for i, (metric, label) in enumerate(metrics):
        for ax, lag in zip(axes[i], args.lags, strict=True):
            for method in methods:
                curves: dict[int, dict[int, float]] = {}
                for row in rows:
                    if row["method"] == method.name and row["lag"] == lag:
                        curves.setdefault(row["seed"], {})[row["step"]] = row[metric]
                if not curves:
                    continue
                steps = sorted(set.intersection(*(set(curve) for curve in curves.values())))
                values = np.array([[curve[step] for step in steps] for curve in curves.values()])
                ax.plot(steps, values.mean(axis=0), label=f"{method.label}, {len(curves)} seeds")
                ax.fill_between(steps, values.min(axis=0), values.max(axis=0), alpha=0.2)
            ax.set_title(f"policy lag K = {lag} optimizer steps", fontsize=10)
            ax.grid(alpha=0.3)
            if ax is axes[i][0]:
                ax.set_ylabel(f"held-out {label}")
            if i == len(metrics) - 1:
                ax.set_xlabel("optimizer step")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _number(value: str) -> float | None:
    return float(value) if value != "" else None


def read_results(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The accuracy curves, TRL logs and summary rows of a finished run, read back from ``out``'s CSV files."""
    tables = []
    for name in ("runs.csv", "train_log.csv", "summary.csv"):
        with open(out / name, newline="") as f:
            rows = []
            for row in csv.DictReader(f):
                parsed: dict[str, Any] = {}
                for key, value in row.items():
                    if key == "lag":
                        parsed[key] = parse_lag(value)
                    elif key in ("seed", "step"):
                        parsed[key] = int(value)
                    elif key in ("method", "accuracy_kind", "loss_type", "vaco_form", "settings"):
                        parsed[key] = value
                    else:
                        parsed[key] = value if name == "summary.csv" and value == "" else _number(value)
                rows.append(parsed)
            tables.append(rows)
    return tables[0], tables[1], tables[2]


def write_summary(
    args: argparse.Namespace,
    methods: list[Method],
    rows: list[dict[str, Any]],
    logs: list[dict[str, Any]],
    summary: list[dict[str, Any]],
) -> None:
    """``summary.md`` (the gain tables, headline accuracy first, then per run) and ``accuracy.png``."""
    kinds = [args.accuracy, *({"greedy", "sampled"} - {args.accuracy})]
    reference = f"vaco_{DEFAULT_FORM}"
    tables = [
        gains(summary, kinds[0]),
        kept_against(summary, kinds[0], reference),
        gain_against(summary, kinds[0], reference),
        *(gains(summary, k) for k in kinds[1:]),
    ]
    (args.out / "summary.md").write_text("\n".join(table for table in tables if table) + "\n" + summarize(rows, logs))
    plot(rows, args, methods, args.out / "accuracy.png")


RESULT_FILES = ("runs.csv", "train_log.csv", "summary.csv")


def merge_results(out: Path, sources: list[Path]) -> None:
    """
    Add the runs of each folder in ``sources`` to ``out``'s CSV files (created if absent), replacing those of the same
    (method, lag, seed); the columns are the union, ``out``'s first (a run that lacks one leaves it empty).
    """
    out.mkdir(parents=True, exist_ok=True)
    for name in RESULT_FILES:
        columns: list[str] = []
        tables = []
        for folder in [out, *sources]:
            path = folder / name
            if not path.is_file():
                continue
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                columns += [column for column in reader.fieldnames or [] if column not in columns]
                tables.append(list(reader))
        replaced = {(row["method"], row["lag"], row["seed"]) for table in tables[1:] for row in table}
        rows = [row for row in tables[0] if (row["method"], row["lag"], row["seed"]) not in replaced] if tables else []
        rows += [row for table in tables[1:] for row in table]
        with open(out / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(rows)


def summarize_saved(args: argparse.Namespace) -> None:
    """``--summarize-only``: ``summary.md`` and ``accuracy.png`` rewritten from the CSV files in ``--out``."""
    config = args.out / "config.json"
    if config.is_file():  # the settings the runs had (plot labels, headline accuracy)
        saved = json.loads(config.read_text())["args"]
        for key in ("epsilon", "tv_threshold", "eval_temperature", "accuracy"):
            setattr(args, key, saved.get(key, getattr(args, key)))
    rows, logs, summary = read_results(args.out)
    args.lags = sorted({row["lag"] for row in rows}, key=lag_order)
    methods = [parse_method(name, args) for name in dict.fromkeys(row["method"] for row in summary)]
    write_summary(args, methods, rows, logs, summary)
    print((args.out / "summary.md").read_text())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.merge_from:
        merge_results(args.out, args.merge_from)
    if args.summarize_only or args.merge_from:
        summarize_saved(args)
        return
    methods = [parse_method(method, args) for method in args.methods]  # fail before any run on an unknown method
    args.methods = [method.name for method in methods]
    if args.accuracy == "sampled" and args.eval_samples <= 0:
        raise ValueError("--accuracy sampled needs --eval-samples > 0")
    th.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    logs: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    timings: dict[str, float] = {}
    start = time.perf_counter()
    for seed in args.seeds:
        seed_start = time.perf_counter()
        model, tokenizer, train, held_out = load_model_and_data(args, seed)
        timings[f"warmup_seed{seed}"] = time.perf_counter() - seed_start
        for lag in args.lags:
            for method in methods:
                curve, history, wall = run_one(args, method, lag, seed, model, tokenizer, train, held_out)
                name = method.name
                timings[f"{name}_lag{lag}_seed{seed}"] = wall
                rows += [
                    {"method": name, "lag": lag, "seed": seed, "step": s, "accuracy": a, "sampled_accuracy": p}
                    for s, a, p in curve
                ]
                run_logs = [
                    {"method": name, "lag": lag, "seed": seed, "step": entry["step"]}
                    | {key: entry.get(key) for key in LOG_KEYS}
                    for entry in history
                    if "step" in entry and "train_runtime" not in entry
                ]
                logs += run_logs
                summary.append(summary_row(args, method, lag, seed, curve, run_logs, wall))
                print(
                    f"{name} lag={lag} seed={seed}: greedy accuracy {curve[0][1]:.3f} -> {curve[-1][1]:.3f} ({wall:.0f} s)",
                    flush=True,
                )
    total = time.perf_counter() - start

    with open(args.out / "runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["method", "lag", "seed", "step", "accuracy", "sampled_accuracy"])
        writer.writeheader()
        writer.writerows(rows)
    with open(args.out / "train_log.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["method", "lag", "seed", "step", *LOG_KEYS])
        writer.writeheader()
        writer.writerows(logs)
    with open(args.out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows(summary)
    write_summary(args, methods, rows, logs, summary)
    import transformers
    import trl

    meta = {
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "wall_time_s": round(total, 1),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "versions": {"torch": th.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        "platform": platform.platform(),
        "threads": th.get_num_threads(),
    }
    (args.out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    print((args.out / "summary.md").read_text())
    print(f"total wall time {total:.0f} s")


if __name__ == "__main__":
    main()
