"""The LLM extra: VACO's forms (token, sequence, decoupled) in closed form, the TRL trainer on a tiny model, and the demo
script's real-model path on a saved tiny model (the snapshot ring, shared with the SB3 algorithms, is tested in
test_lag.py)."""

import csv
import json
import math
import os
import random
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before huggingface_hub is imported: no network, no telemetry
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest

pytest.importorskip("trl")

import torch as th
from datasets import Dataset
from transformers.trainer_callback import PrinterCallback
from trl import GRPOTrainer

from sb3_vaco.common.losses import MAX_LOG_RATIO, tv_filtered_surrogate
from sb3_vaco.llm import (
    SUPPORTED_TRL,
    VACOGRPOConfig,
    VACOGRPOTrainer,
    check_trl,
    masked_tv_filtered_surrogate,
    sampler_importance_ratio,
    vaco_decoupled_loss,
    vaco_sequence_loss,
    vaco_token_loss,
)
from vaco_lab.math_task import (
    build_tiny_model,
    build_tokenizer,
    exact_answer_reward,
    extract_answer,
    load_gsm8k,
    make_word_problems,
    noisy_answer,
    supervised_warmup,
)

# Two completions of 3 and 2 tokens (the last position of the second one is padding).
TOKEN_MASK = th.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADVANTAGES = th.tensor([1.0, -1.0])


def test_nothing_masked_under_threshold():
    ratio = th.tensor([[1.1, 0.9, 1.2], [0.8, 1.1, 5.0]], requires_grad=True)
    out = masked_tv_filtered_surrogate(ratio, ADVANTAGES, tv_threshold=0.5, token_mask=TOKEN_MASK)
    valid_q = th.tensor([1.1, 0.9, 1.2, 0.8, 1.1])
    assert out.tv_estimate.item() == pytest.approx(0.5 * th.mean(th.abs(valid_q - 1)).item())  # padding ignored
    assert not out.filter_active
    assert th.equal(out.mask, TOKEN_MASK)
    expected = -th.mean(valid_q * th.tensor([1.0, 1.0, 1.0, -1.0, -1.0]))
    assert out.loss.item() == pytest.approx(expected.item())


def test_exact_mask_above_threshold():
    ratio = th.tensor([[1.5, 0.5, 1.0], [1.5, 0.5, 9.0]], requires_grad=True)
    out = masked_tv_filtered_surrogate(ratio, ADVANTAGES, tv_threshold=0.1, token_mask=TOKEN_MASK)
    assert out.tv_estimate.item() == pytest.approx(0.5 * 2.0 / 5)  # ½·mean(.5, .5, 0, .5, .5)
    assert out.filter_active
    # Â·(q−1) > 0 is dropped: (+1, q=1.5) and (−1, q=0.5); q = 1 exactly is kept; padding is 0
    assert th.equal(out.mask, th.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
    assert out.loss.item() == pytest.approx(-(0.5 * 1.0 + 1.0 * 1.0 + 1.5 * -1.0) / 5)
    out.loss.backward()
    assert th.allclose(ratio.grad, -th.tensor([[0.0, 1.0, 1.0], [-1.0, 0.0, 0.0]]) / 5)


def test_matches_flat_rule_with_weights():
    gen = th.Generator().manual_seed(0)
    ratio = th.exp(0.5 * th.randn(4, 6, generator=gen))
    advantages = th.randn(4, generator=gen)
    weights = th.rand(4, 6, generator=gen) + 0.5
    mask = (th.rand(4, 6, generator=gen) > 0.3).float()
    out = masked_tv_filtered_surrogate(ratio, advantages, 0.1, mask, weights)
    valid = mask.bool()
    flat = tv_filtered_surrogate(ratio[valid], advantages[:, None].expand(4, 6)[valid], 0.1, weights[valid])
    assert out.loss.item() == pytest.approx(flat.loss.item())
    assert out.tv_estimate.item() == pytest.approx(flat.tv_estimate.item())
    assert th.equal(out.mask[valid], flat.mask)


@pytest.mark.parametrize("valid_tokens", [True, False])
def test_all_masked_or_empty_gives_zero_gradient(valid_tokens):
    # Every sample pushes away (Â > 0, q > 1) and D̂ > δ: all filtered. Or no valid token at all.
    ratio = th.full((2, 3), 3.0, requires_grad=True)
    mask = TOKEN_MASK if valid_tokens else th.zeros(2, 3)
    out = masked_tv_filtered_surrogate(ratio, th.tensor([2.0, 1.0]), 0.2, mask)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert th.equal(ratio.grad, th.zeros(2, 3))
    assert th.isfinite(out.loss) and th.isfinite(out.tv_estimate)


def test_sequence_level_ratio():
    ratio = th.tensor([[1.6], [0.9]], requires_grad=True)
    out = masked_tv_filtered_surrogate(ratio, ADVANTAGES, 0.1, TOKEN_MASK)
    assert out.tv_estimate.item() == pytest.approx(0.5 * (0.6 + 0.1) / 2)
    assert th.equal(out.mask, th.tensor([[0.0], [0.0]]))  # both push away: +1·0.6 > 0, −1·(−0.1) > 0


def _logps(values):
    """Log-probs with gradient from a nested list of probability ratios (shape (2, 3))."""
    return th.log(th.tensor(values)).requires_grad_(True)


def test_token_form_is_the_filter_on_the_behavior_ratio():
    behavior = th.log(th.tensor([[0.5, 0.2, 0.1], [0.3, 0.6, 0.9]]))
    logps = (behavior + th.log(th.tensor([[1.5, 0.5, 1.0], [1.5, 0.5, 9.0]]))).requires_grad_(True)
    out = vaco_token_loss(logps, behavior, ADVANTAGES, TOKEN_MASK, 0.1)
    ref = masked_tv_filtered_surrogate(th.exp(logps.detach() - behavior), ADVANTAGES, 0.1, TOKEN_MASK)
    assert th.equal(out.mask, th.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))  # as in test_exact_mask_above_threshold
    assert out.loss.item() == pytest.approx(ref.loss.item())
    assert out.tv_estimate.item() == pytest.approx(0.2) and out.filter_active == 1.0 and out.weights is None
    out.loss.backward()  # d/d log π_θ of −q·Â/5 is −q·Â/5 on the kept tokens
    assert th.allclose(logps.grad, -th.tensor([[0.0, 0.5, 1.0], [-1.5, 0.0, 0.0]]) / 5)


# log ρ = log π_T − log μ: the lag already present when the batch enters training. The padding entry (row 1, last)
# is NaN to check that it is ignored.
LOG_RHO = th.log(th.tensor([[2.0, 1.0, 0.5], [1.2, 0.8, float("nan")]]))


def _sequence_loss(log_rho=LOG_RHO, ratio=1.0, advantages=ADVANTAGES, token_mask=TOKEN_MASK, **kwargs):
    proximal = th.full((2, 3), -1.0)
    logps = (proximal + math.log(ratio)).requires_grad_(True)
    out = vaco_sequence_loss(logps, proximal, proximal - log_rho, advantages, token_mask, **kwargs)
    out.loss.backward()
    return out, logps.grad


def test_sequence_form_drops_tv_increasing_tokens_of_completions_over_budget():
    # D_0 = ½·mean(|2 − 1|, 0, |0.5 − 1|) = 0.25 > δ; D_1 = ½·mean(0.2, 0.2) = 0.1 ≤ δ
    out, grad = _sequence_loss(tv_threshold=0.2)
    assert out.tv_estimate.item() == pytest.approx((0.25 + 0.1) / 2)
    assert out.filter_active == 0.5  # one completion of two over the budget
    # Completion 0 (Â = +1): ρ = 2 would grow (sign(log ρ)·Â > 0): dropped; ρ = 1 (sign 0) and ρ = 0.5 kept
    assert th.equal(out.mask, th.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]]))
    weights = th.tensor([[0.0, 1.0, 0.5], [1.2, 0.8, 0.0]])  # m·min(ρ, 2)
    assert th.allclose(out.weights, weights)
    # π_θ = π_T: r = 1, L = −Σ w·Â / 5 valid tokens
    assert out.loss.item() == pytest.approx(-(1.0 + 0.5 - 1.2 - 0.8) / 5)
    assert th.allclose(grad, -weights * ADVANTAGES[:, None] / 5)
    # Below δ = 0.05 completion 1 is over budget too: ρ = 0.8 with Â = −1 would move away from 1 (dropped)
    out, _ = _sequence_loss(tv_threshold=0.05)
    assert th.equal(out.mask, th.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
    assert out.filter_active == 1.0


def test_sequence_form_drift_test_measures_the_learner():
    # No lag (ρ = 1), the learner has moved to π_θ = π_T / 2: q = π_θ/μ = 0.5, D_i = ¼ > δ for both completions
    no_lag = th.zeros(2, 3)
    out, grad = _sequence_loss(log_rho=no_lag, ratio=0.5, tv_threshold=0.2)
    assert out.filter_active == 0.0 and th.equal(out.mask, TOKEN_MASK)  # the default tests ρ only
    out, grad = _sequence_loss(log_rho=no_lag, ratio=0.5, tv_threshold=0.2, filter_drift=True)
    assert out.filter_active == 1.0 and out.tv_estimate.item() == pytest.approx(0.25)
    # Â = −1 would push q further below 1: completion 1 dropped; Â = +1 pulls it back: kept (r = 0.5 < 1 − ε with
    # Â > 0 is not clipped)
    assert th.equal(out.mask, th.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert th.equal(grad[1], th.zeros(3)) and bool((grad[0] != 0).all())
    # Without drift (π_θ = π_T) the two tests coincide
    for threshold in (0.05, 0.2):
        default, default_grad = _sequence_loss(tv_threshold=threshold)
        drift, drift_grad = _sequence_loss(tv_threshold=threshold, filter_drift=True)
        assert th.equal(default.mask, drift.mask) and th.equal(default_grad, drift_grad)


def test_sequence_form_truncates_weights_and_clips():
    out, _ = _sequence_loss(tv_threshold=10.0, rho_bar=1.0)
    assert out.filter_active == 0.0
    assert th.allclose(out.weights, th.tensor([[1.0, 1.0, 0.5], [1.0, 0.8, 0.0]]))
    # r = 1.5 > 1 + ε on every token: clipped (zero gradient) where Â > 0, not where Â < 0
    out, grad = _sequence_loss(ratio=1.5, tv_threshold=10.0, epsilon_low=0.2, epsilon_high=0.2)
    assert out.clip_fraction == pytest.approx(3 / 5)
    assert th.equal(grad[0], th.zeros(3))
    assert th.allclose(grad[1], th.tensor([1.2 * 1.5, 0.8 * 1.5, 0.0]) / 5)
    assert out.loss.item() == pytest.approx(-(1.2 * (2.0 + 1.0 + 0.5) - 1.5 * (1.2 + 0.8)) / 5)


@pytest.mark.parametrize("valid_tokens", [True, False])
def test_sequence_form_fully_filtered_gives_zero_gradient(valid_tokens):
    # Every ρ = 3 > 1 with Â > 0, D = 1 > δ: every token is dropped. Or no valid token at all.
    log_rho = th.full((2, 3), math.log(3.0))
    mask = TOKEN_MASK if valid_tokens else th.zeros(2, 3)
    out, grad = _sequence_loss(log_rho, advantages=th.tensor([2.0, 1.0]), token_mask=mask, tv_threshold=0.2)
    assert out.loss.item() == 0.0 and th.equal(grad, th.zeros(2, 3))
    assert th.isfinite(out.tv_estimate) and not th.isnan(grad).any()
    # One completion filtered, the other (Â < 0) kept: only the kept one has a gradient
    out, grad = _sequence_loss(log_rho, advantages=th.tensor([2.0, -1.0]), tv_threshold=0.2)
    assert th.equal(grad[0], th.zeros(3)) and (grad[1, :2] != 0).all()


def test_sequence_form_clamps_extreme_log_ratios():
    log_rho = th.tensor([[50.0, -50.0, 0.0], [0.0, 0.0, 0.0]])
    out, grad = _sequence_loss(log_rho, tv_threshold=1e9, rho_bar=2.0)
    assert th.allclose(out.weights[0], th.tensor([2.0, math.exp(-MAX_LOG_RATIO), 1.0]))
    assert th.isfinite(out.loss) and th.isfinite(grad).all() and th.isfinite(out.tv_estimate)


def test_decoupled_form_filters_around_the_proximal_policy():
    proximal = th.log(th.tensor([[0.3, 0.2, 0.1], [0.4, 0.4, 0.4]]))
    behavior = proximal - th.log(th.tensor([[3.0, 1.0, 1.0], [1.0, 0.5, 1.0]]))  # ρ = π_T/μ
    logps = (proximal + th.log(th.tensor([[1.5, 0.5, 1.0], [2.0, 0.5, 1.0]]))).requires_grad_(True)  # q = π_θ/π_T
    out = vaco_decoupled_loss(logps, proximal, behavior, ADVANTAGES, TOKEN_MASK, tv_threshold=0.2, rho_bar=2.0)
    # w = min(ρ, 2) = [[2, 1, 1], [1, 0.5]]; D̂ = ½·(2·0.5 + 0.5 + 0 + 1 + 0.5·0.5) / 5 = 0.275 > δ
    assert out.tv_estimate.item() == pytest.approx(0.275) and out.filter_active == 1.0
    # Â·(q − 1) > 0 dropped: (+1, q = 1.5) and (−1, q = 0.5)
    assert th.equal(out.mask, th.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
    assert th.allclose(out.weights, th.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
    assert out.loss.item() == pytest.approx(-(1.0 * 0.5 + 1.0 * 1.0 - 1.0 * 2.0) / 5)
    out.loss.backward()
    assert th.allclose(logps.grad, -th.tensor([[0.0, 0.5, 1.0], [-2.0, 0.0, 0.0]]) / 5)
    # Untruncated weights: the first token weighs 3 in the estimate
    untruncated = vaco_decoupled_loss(logps, proximal, behavior, ADVANTAGES, TOKEN_MASK, 0.2, rho_bar=math.inf)
    assert untruncated.tv_estimate.item() == pytest.approx(0.5 * (3 * 0.5 + 0.5 + 1 + 0.25) / 5)


@pytest.mark.parametrize("sequence_ratio", [False, True])
def test_forms_coincide_without_lag(sequence_ratio):
    # μ = π_T: the decoupled form is the token form (ρ = 1, any ρ̄ ≥ 1)
    gen = th.Generator().manual_seed(0)
    proximal = -th.rand(8, 6, generator=gen) - 0.1
    logps = (proximal + 0.3 * th.randn(8, 6, generator=gen)).requires_grad_(True)
    advantages = th.randn(8, generator=gen)
    mask = (th.rand(8, 6, generator=gen) > 0.3).float()
    token = vaco_token_loss(logps, proximal, advantages, mask, 0.05, sequence_ratio)
    decoupled = vaco_decoupled_loss(logps, proximal, proximal, advantages, mask, 0.05, 1.0, sequence_ratio)
    assert token.filter_active == 1.0 and 0 < token.mask.sum() < (mask.sum() if not sequence_ratio else 8)
    assert token.loss.item() == pytest.approx(decoupled.loss.item())
    assert th.equal(token.mask, decoupled.mask)
    # ... and the sequence form is PPO's clipped surrogate (ρ = 1: nothing filtered, weights 1)
    sequence = vaco_sequence_loss(logps, proximal, proximal, advantages, mask, 0.0)
    ratio = th.exp(logps.detach() - proximal)
    a = advantages[:, None]
    clipped = th.min(ratio * a, th.clamp(ratio, 0.8, 1.2) * a)
    assert sequence.loss.item() == pytest.approx(-(clipped * mask).sum().item() / mask.sum().item())
    assert sequence.filter_active == 0.0 and th.equal(sequence.mask, mask)


def test_extract_answer():
    assert extract_answer("1 7 <eos>") == "17"
    assert extract_answer("so 3 + 4 = 7. #### 1,234") == "1234"
    assert extract_answer("The answer is 12.0") == "12"
    assert extract_answer("no number") is None
    assert exact_answer_reward(["1 2", "3"], answer=["12", "4"]) == [1.0, 0.0]


def test_noisy_answer_is_a_near_miss():
    rng = random.Random(0)
    for answer in ("0", "1", "7", "42"):
        misses = {int(noisy_answer(answer, rng)) for _ in range(200)}
        expected = {int(answer) + offset for offset in (-2, -1, 1, 2)}
        assert misses == {m for m in expected if m >= 0}
    assert {noisy_answer("-1", rng) for _ in range(200)} == {"-3", "-2", "0", "1"}
    assert {noisy_answer("2.5", rng) for _ in range(200)} == {"0.5", "1.5", "3.5", "4.5"}


def test_supervised_warmup_answer_noise():
    tokenizer = build_tokenizer()
    problems = make_word_problems(32, seed=0, max_number=5)
    with pytest.raises(ValueError, match="answer_noise"):
        supervised_warmup(build_tiny_model(tokenizer, hidden_size=16, num_layers=1), tokenizer, problems, 1, answer_noise=1.0)
    # No noise is the plain warm-up, draw for draw; noise changes the targets, hence the losses.
    losses = [
        supervised_warmup(build_tiny_model(tokenizer, hidden_size=16, num_layers=1), tokenizer, problems, 3, 8, answer_noise=p)
        for p in (0.0, 0.0, 0.9)
    ]
    assert losses[0] == losses[1] and losses[2] != losses[0]


def _length_reward(completions, **kwargs):
    """A reward that differs within every group (the tiny model never solves a problem): the completion's length."""
    return [float(len(completion)) for completion in completions]


def _trainer(tmp_path, max_steps=4, reward_funcs=exact_answer_reward, **config_kwargs):
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, seed=0)
    kwargs = dict(
        output_dir=str(tmp_path),
        max_steps=max_steps,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=3,
        learning_rate=1e-2,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        gradient_checkpointing=False,
        logging_steps=1,
        seed=0,
    )
    kwargs.update(config_kwargs)
    trainer = VACOGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=VACOGRPOConfig(**kwargs),
        train_dataset=Dataset.from_list(make_word_problems(64, seed=0, max_number=5)),
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


def _logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if entry.get(key) is not None]


@pytest.mark.parametrize("form, level", [("token", "token"), ("token", "sequence"), ("decoupled", "sequence")])
def test_trainer_runs_vaco(tmp_path, form, level):
    trainer = _trainer(tmp_path, steps_per_generation=2, vaco_form=form, importance_sampling_level=level)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 4
    assert any(not th.equal(b, p) for b, p in zip(before, trainer.model.parameters(), strict=True))
    tv = _logged(trainer, "tv_estimate")
    assert len(tv) == 4 and all(t >= 0 for t in tv)
    assert tv[0] == 0.0  # first step of a generation batch: π_θ = μ, ratio exactly 1
    assert all(0.0 <= f <= 1.0 for f in _logged(trainer, "filtered_fraction"))
    assert all(th.isfinite(th.tensor(loss)) for loss in _logged(trainer, "loss"))


@pytest.mark.parametrize("form", ["token", "sequence", "decoupled"])
def test_trainer_runs_each_form_under_lag(tmp_path, form):
    # A generation every 2 steps by the model 2 steps stale: the second batch has μ ≠ π_T
    trainer = _trainer(tmp_path, max_steps=4, steps_per_generation=2, policy_lag=2, vaco_form=form)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 4 and trainer.generation_versions == [(0, 0), (2, 0)]
    assert any(not th.equal(b, p) for b, p in zip(before, trainer.model.parameters(), strict=True))
    assert _logged(trainer, "tv_behavior")[-1] > 0.0
    for key in ("loss", "tv_estimate", "filtered_fraction", "filter_active_fraction"):
        values = _logged(trainer, key)
        assert len(values) == 4 and all(math.isfinite(v) for v in values), key
    assert all(0.0 <= f <= 1.0 for f in _logged(trainer, "filtered_fraction"))
    weights = _logged(trainer, "importance_weight")
    if form == "token":
        assert weights == []
    else:  # the first batch is aligned (ρ = 1), the second one lagged
        assert len(weights) == 4 and weights[0] == pytest.approx(1.0) and weights[-1] != pytest.approx(1.0)
    if form == "sequence":
        assert len(_logged(trainer, "clip_ratio/region_mean")) == 4


def test_lagged_generations_carry_their_version(tmp_path):
    # One optimizer step per micro-batch, a generation every 2 steps, generated by the model 2 steps stale.
    trainer = _trainer(tmp_path, max_steps=8, steps_per_generation=2, policy_lag=2)
    trainer.train()
    assert trainer.generation_versions == [(0, 0), (2, 0), (4, 2), (6, 4)]
    batch = trainer._buffered_inputs[0]
    valid = batch["completion_mask"].bool()
    # μ, in TRL's sampler slot, are the generating snapshot's log-probs by the loss's forward...
    assert trainer._actor_version == 4
    actor_logps = trainer._score(
        trainer._actor, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"]
    )
    assert th.allclose(batch["sampling_per_token_logps"][valid], actor_logps[valid], atol=1e-5)
    # ...not the learner's at generation (TRL's old log-probs): it has moved since version 4
    assert not th.allclose(batch["sampling_per_token_logps"][valid], batch["old_per_token_logps"][valid])
    assert _logged(trainer, "generation_lag")[-1] == 2.0
    assert _logged(trainer, "policy_lag")[-1] >= 2.0
    assert _logged(trainer, "tv_behavior")[-1] > 0.0


def test_generation_ahead_is_a_lag_of_whole_generation_periods(tmp_path):
    # Two micro-steps per generation, one per optimizer step: each batch is generated by the learner as it was when
    # the previous batch entered training, two optimizer steps earlier.
    trainer = _trainer(tmp_path, max_steps=8, steps_per_generation=2, generation_ahead=1)
    assert trainer.args.injected_lag == trainer.policy_lag == 2
    trainer.train()
    assert trainer.generation_versions == [(0, 0), (2, 0), (4, 2), (6, 4)]
    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="not both"):
        VACOGRPOConfig(generation_ahead=1, policy_lag=2, **common)
    with pytest.raises(ValueError, match="whole optimizer steps"):
        VACOGRPOConfig(generation_ahead=1, steps_per_generation=2, gradient_accumulation_steps=4, **common)
    with pytest.raises(ValueError, match="generation_ahead"):
        VACOGRPOConfig(generation_ahead=-1, **common)


def test_stale_actor_as_old_policy_takes_the_ratio_to_the_generating_policy(tmp_path):
    trainer = _trainer(
        tmp_path, max_steps=6, steps_per_generation=2, policy_lag=2, loss_type="dapo", stale_actor_as="old_policy"
    )
    trainer.train()
    batch = trainer._buffered_inputs[0]
    inputs = trainer._stale_actor_inputs(trainer.model, batch, "train")
    assert "sampling_per_token_logps" not in inputs and th.equal(inputs["advantages"], batch["advantages"])
    assert th.equal(inputs["old_per_token_logps"], batch["sampling_per_token_logps"])
    assert len(_logged(trainer, "clip_ratio/region_mean")) > 0 and _logged(trainer, "sampler_correction") == []


# TRL's remedies under lag, each as TRL runs it on vLLM's log-probs (the settings of docs/llm.md, small bounds so that
# the tiny runs trigger them)
REMEDIES = {
    "grpo_mis": {"loss_type": "dapo"},
    "grpo_tis": {
        "loss_type": "dapo",
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_max": 1.02,
    },
    "opsm": {"loss_type": "dapo", "off_policy_mask_threshold": 0.01},
    "cispo": {"loss_type": "cispo", "epsilon_high": 5.0},
    "sapo": {"loss_type": "sapo"},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    "vespo": {"loss_type": "vespo", "vllm_importance_sampling_mode": "token_truncate"},
}


@pytest.mark.parametrize("remedy", sorted(REMEDIES))
def test_trl_remedy_sees_the_stale_actor_as_vllm(tmp_path, remedy):
    """TRL's own loss under lag equals TRL's loss with its vLLM sampler correction, and the correction moves."""
    settings = REMEDIES[remedy]
    trainer = _trainer(tmp_path, max_steps=6, steps_per_generation=2, policy_lag=2, reward_funcs=_length_reward, **settings)
    trainer.train()
    batch = trainer._buffered_inputs[0]  # generated 2 steps stale
    assert (batch["advantages"] < 0).any() and (batch["advantages"] > 0).any()
    model, args = trainer.model, trainer.args
    mask = batch["completion_mask"].float()
    rho = sampler_importance_ratio(
        batch["old_per_token_logps"],
        batch["sampling_per_token_logps"],
        mask,
        args.vllm_importance_sampling_mode,
        args.vllm_importance_sampling_clip_min,
        args.vllm_importance_sampling_clip_max,
    )
    assert not th.allclose(rho.expand_as(mask)[mask.bool()], th.ones(()))  # the correction weighs the stale batch

    def loss_and_grads(compute):
        model.zero_grad()
        loss = compute()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    ours = loss_and_grads(lambda: trainer.compute_loss(model, batch))
    trainer.use_vllm = True  # TRL's own correction, as it applies it to vLLM's log-probs
    try:
        trls = loss_and_grads(lambda: GRPOTrainer.compute_loss(trainer, model, batch | {"importance_sampling_ratio": rho}))
    finally:
        trainer.use_vllm = False
    assert th.allclose(ours[0], trls[0], rtol=1e-5, atol=1e-7)
    assert all(th.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(ours[1], trls[1], strict=True))
    corrections = _logged(trainer, "sampler_correction")
    assert corrections and corrections[-1] != pytest.approx(1.0)
    if remedy == "opsm":
        assert max(_logged(trainer, "off_policy_mask/dropped_fraction")) > 0.0


def test_trl_check_names_the_supported_versions():
    check_trl()  # the installed TRL
    root = Path(__file__).resolve().parents[1]
    pins = [line.strip() for line in (root / "setup.cfg").read_text().splitlines() if line.strip().startswith("trl")]
    assert pins == [f"trl{SUPPORTED_TRL}"]  # the llm extra installs what the trainer supports
    assert f"`trl{SUPPORTED_TRL}`" in (root / "docs" / "llm.md").read_text()

    class Renamed(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, num_generations):  # type: ignore[override]
            raise NotImplementedError

    with pytest.raises(ImportError, match=re.escape(f"supports trl{SUPPORTED_TRL}")):
        check_trl(Renamed)


def test_config_validation(tmp_path):
    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="vaco_form"):
        VACOGRPOConfig(vaco_form="nope", **common)
    with pytest.raises(ValueError, match="importance_sampling_level"):
        VACOGRPOConfig(vaco_form="sequence", importance_sampling_level="sequence", **common)
    with pytest.raises(ValueError, match="policy_lag"):
        VACOGRPOConfig(policy_lag=-1, **common)
    with pytest.raises(ValueError, match="policy_lag"):
        VACOGRPOConfig(policy_lag=2.5, **common)
    with pytest.raises(ValueError, match="generation_ahead"):
        VACOGRPOConfig(generation_ahead=True, **common)
    with pytest.raises(ValueError, match="tv_threshold"):
        VACOGRPOConfig(tv_threshold=float("nan"), **common)  # NaN would switch the filter off silently
    with pytest.raises(ValueError, match="tv_reference"):
        VACOGRPOConfig(tv_reference="nope", **common)
    with pytest.raises(ValueError, match="rho_bar"):
        VACOGRPOConfig(vaco_form="decoupled", rho_bar=0.0, **common)
    with pytest.raises(ValueError, match="stale_actor_as"):
        VACOGRPOConfig(stale_actor_as="nope", **common)
    with pytest.raises(ValueError, match="filter_drift"):
        VACOGRPOConfig(vaco_form="token", filter_drift=True, **common)
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode='token_truncate'"):
        VACOGRPOConfig(loss_type="vespo", policy_lag=2, **common)  # TRL's default correction is per sequence
    # the sequence form's token-ratio rule binds VACO only: TRL's losses take sequence ratios (GSPO)
    VACOGRPOConfig(loss_type="grpo", importance_sampling_level="sequence", **common)
    # Each form's own truncation by default
    assert [VACOGRPOConfig(vaco_form=form, **common).rho_bar for form in ("token", "sequence", "decoupled")] == [
        math.inf,
        2.0,
        1.0,
    ]


@pytest.mark.parametrize(
    "tv_reference, form, rho_bar",
    [("behavior", "token", math.inf), ("learner", "decoupled", math.inf), ("decoupled", "decoupled", 1.0)],
)
def test_deprecated_tv_reference(tmp_path, tv_reference, form, rho_bar):
    with pytest.warns(FutureWarning, match="vaco_form"):
        config = VACOGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", tv_reference=tv_reference)
    assert (config.vaco_form, config.rho_bar) == (form, rho_bar)
    with pytest.warns(FutureWarning, match="rho_bar"):
        config = VACOGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", vaco_form="sequence", pg_rho_bar=3.0)
    assert config.rho_bar == 3.0


# ----- the demo script (loaded from its file, as tests/test_wallclock.py loads analyze.py) --------------------------

DEMO = Path(__file__).resolve().parents[1] / "scripts" / "llm_gsm_demo.py"

# GSM8K's format: the worked answer ends with "#### <number>". Words from the toy tokenizer's vocabulary.
GSM8K_ROWS = [
    {"question": "ann has 3 apples . bob gives ann 2 more . how many apples does ann have ?", "answer": "3 + 2 = 5 .\n#### 5"},
    {"question": "cat has 7 pens and gives 4 to dan . how many pens does cat have now ?", "answer": "7 - 4 = 3 .\n#### 3"},
    {"question": "eve buys 2 boxes of 3 eggs . how many eggs in total ?", "answer": "2 * 3 = 6 .\n#### 6"},
    {"question": "fay has 1 , 2 0 0 coins . how many coins does fay have ?", "answer": "#### 1,200"},
]


def _demo():
    import llm_gsm_demo  # scripts/ is on the test path (pyproject.toml)

    return llm_gsm_demo


def test_demo_method_names():
    demo = _demo()
    args = demo.parse_args([])
    assert [demo.parse_method(m, args).name for m in demo.METHODS] == list(demo.METHODS)
    assert args.methods == ["grpo", "vaco_token", "vaco_sequence", "vaco_decoupled"]
    opsm = demo.parse_method("opsm@0.05", args)
    assert (opsm.name, opsm.loss_type, dict(opsm.settings)["off_policy_mask_threshold"]) == ("opsm@0.05", "dapo", 0.05)
    assert dict(demo.parse_method("grpo", args).settings)["stale_actor_as"] == "old_policy"  # the naive baseline
    with pytest.raises(ValueError, match="unknown method"):
        demo.parse_method("cispo@0.1", args)
    assert demo.parse_args(["--lags", "0", "async"]).lags == [0, "async"]
    method = demo.parse_method("vaco@0.05", args)
    expected = ("vaco_sequence@0.05", "vaco", "sequence", 0.05)  # vaco: the trainer's default form
    assert (method.name, method.loss_type, method.form, method.tv_threshold) == expected
    assert demo.parse_method("vaco_sequence", args).tv_threshold == args.tv_threshold
    with pytest.raises(ValueError, match="unknown method"):
        demo.parse_method("vaco_nope", args)
    assert args.accuracy == "sampled" and demo.parse_args(["--eval-samples", "0"]).accuracy == "greedy"


def test_demo_real_model_path(tmp_path):
    # A local model folder (save_pretrained) and a local GSM8K-format .jsonl, every method at two lags, two steps
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_layers=1, seed=0).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in GSM8K_ROWS))
    assert [p["answer"] for p in load_gsm8k(data)] == ["5", "3", "6", "1200"]
    out = tmp_path / "out"
    methods = ["grpo", "vaco_token", "vaco_sequence@0.1", "vaco_decoupled", "opsm@0.5", "vespo"]
    # fmt: off
    _demo().main([
        "--model", str(tmp_path / "model"), "--dataset", str(data), "--eval-dataset", str(data), "--out", str(out),
        "--methods", *methods, "--lag", "0", "async", "--seeds", "0", "--max-steps", "4", "--warmup-steps", "2",
        "--batch-size", "8", "--num-generations", "4", "--steps-per-generation", "2", "--max-completion-length", "3",
        "--eval-every", "1", "--eval-samples", "1",
    ])
    # fmt: on
    with open(out / "summary.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    columns = ("method", "lag", "seed", "start_accuracy", "final_accuracy")
    assert reader.fieldnames is not None and tuple(reader.fieldnames[:5]) == columns
    runs = [(m, lag, "0") for lag in ("0", "async") for m in methods]
    assert [(row["method"], row["lag"], row["seed"]) for row in rows] == runs
    for row in rows:
        assert row["accuracy_kind"] == "sampled" and row["steps"] == "4"
        assert row["start_accuracy"] == row["start_accuracy_sampled"]
        assert row["final_accuracy"] == row["final_accuracy_sampled"]
        for key in ("start_accuracy", "final_accuracy", "start_accuracy_sampled", "final_accuracy_sampled"):
            assert 0.0 <= float(row[key]) <= 1.0
        if row["method"].startswith("vaco"):
            assert (row["vaco_form"], row["loss_type"]) == (row["method"][5:].split("@")[0], "vaco")
        else:
            assert (row["vaco_form"], row["loss_type"]) == ("", "vespo" if row["method"] == "vespo" else "dapo")
        if row["lag"] == "async":  # one generation batch ahead: 2 optimizer steps stale
            assert float(row["policy_lag"]) > 1.0 and (row["method"] == "grpo" or row["tv_behavior"] != "")
    assert {row["tv_threshold"] for row in rows if row["method"].startswith("vaco_sequence")} == {"0.1"}
    for name in ("runs.csv", "train_log.csv", "summary.md", "accuracy.png", "config.json"):
        assert (out / name).is_file()
    # The summary rebuilt from the CSV files is the one written after training
    written = (out / "summary.md").read_text()
    assert "Gain = final − start sampled accuracy" in written
    (out / "summary.md").unlink()
    _demo().main(["--summarize-only", "--out", str(out)])
    assert (out / "summary.md").read_text() == written
    # Runs made apart merge into one table: new (method, lag, seed) added, the same ones replaced
    # fmt: off
    _demo().main([
        "--model", str(tmp_path / "model"), "--dataset", str(data), "--eval-dataset", str(data),
        "--out", str(tmp_path / "more"), "--methods", "cispo", "grpo", "--lag", "0", "--seeds", "0", "--max-steps", "2",
        "--warmup-steps", "2", "--batch-size", "8", "--num-generations", "4", "--steps-per-generation", "2",
        "--max-completion-length", "3", "--eval-every", "1", "--eval-samples", "1",
    ])
    # fmt: on
    _demo().main(["--merge-from", str(tmp_path / "more"), "--out", str(out)])
    with open(out / "summary.csv", newline="") as f:
        merged = {(row["method"], row["lag"]): row for row in csv.DictReader(f)}
    assert set(merged) == {(m, lag) for m, lag, _ in runs} | {("cispo", "0")}
    assert merged[("grpo", "0")]["steps"] == "2" and merged[("grpo", "async")]["steps"] == "4"
    assert "| cispo | 0 |" in (out / "summary.md").read_text()
    assert json.loads((out / "config.json").read_text())["args"]["model"] == str(tmp_path / "model")


def test_demo_comparison_tables():
    # Two methods, three seeds: the reference gains 0.1 more than "other" at lag 0 on every seed, and at K = 8
    # keeps half of its gain while "other" keeps all of it
    demo = _demo()
    start = {"start_accuracy_sampled": 0.2}
    runs = [("ref", 0, 0.5), ("ref", 8, 0.35), ("other", 0, 0.4), ("other", 8, 0.4)]
    summary = [
        start | {"method": method, "lag": lag, "seed": seed, "final_accuracy_sampled": final + 0.01 * seed}
        for method, lag, final in runs
        for seed in range(3)
    ]
    gain = demo.gain_against(summary, "sampled", "ref")
    assert "| 0 | other | +0.100 [+0.100, +0.100] | 3 | ref gains more |" in gain
    assert "| 8 | other | -0.050 [-0.050, -0.050] | 3 | other gains more |" in gain
    kept = demo.kept_against(summary, "sampled", "ref")
    assert "| 8 | other |" in kept and "other keeps more" in kept
