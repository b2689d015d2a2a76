"""The LLM extra: the token-level TV filter in closed form and the TRL trainer on a tiny model (its snapshot ring,
shared with the SB3 algorithms, is tested in test_lag.py)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before huggingface_hub is imported: no network, no telemetry
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest

pytest.importorskip("trl")

import torch as th
from datasets import Dataset
from transformers.trainer_callback import PrinterCallback

from sb3_vaco.common.losses import tv_filtered_surrogate
from sb3_vaco.llm import VACOGRPOConfig, VACOGRPOTrainer, masked_tv_filtered_surrogate
from sb3_vaco.llm.math_task import (
    build_tiny_model,
    build_tokenizer,
    exact_answer_reward,
    extract_answer,
    make_word_problems,
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


def test_extract_answer():
    assert extract_answer("1 7 <eos>") == "17"
    assert extract_answer("so 3 + 4 = 7. #### 1,234") == "1234"
    assert extract_answer("The answer is 12.0") == "12"
    assert extract_answer("no number") is None
    assert exact_answer_reward(["1 2", "3"], answer=["12", "4"]) == [1.0, 0.0]


def _trainer(tmp_path, max_steps=4, **config_kwargs):
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
        reward_funcs=exact_answer_reward,
        args=VACOGRPOConfig(**kwargs),
        train_dataset=Dataset.from_list(make_word_problems(64, seed=0, max_number=5)),
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


def _logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if entry.get(key) is not None]


@pytest.mark.parametrize("tv_reference, level", [("behavior", "token"), ("learner", "token"), ("decoupled", "sequence")])
def test_trainer_runs_vaco(tmp_path, tv_reference, level):
    trainer = _trainer(tmp_path, steps_per_generation=2, tv_reference=tv_reference, importance_sampling_level=level)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 4
    assert any(not th.equal(b, p) for b, p in zip(before, trainer.model.parameters(), strict=True))
    tv = _logged(trainer, "tv_estimate")
    assert len(tv) == 4 and all(t >= 0 for t in tv)
    assert tv[0] == 0.0  # first step of a generation batch: π_θ = μ, ratio exactly 1
    assert all(0.0 <= f <= 1.0 for f in _logged(trainer, "filtered_fraction"))
    assert all(th.isfinite(th.tensor(loss)) for loss in _logged(trainer, "loss"))


def test_lagged_generations_carry_their_version(tmp_path):
    # One optimizer step per micro-batch, a generation every 2 steps, generated by the model 2 steps stale.
    trainer = _trainer(tmp_path, max_steps=8, steps_per_generation=2, policy_lag=2)
    trainer.train()
    assert trainer.generation_versions == [(0, 0), (2, 0), (4, 2), (6, 4)]
    batch = trainer._buffered_inputs[0]
    assert th.equal(batch["policy_version"], th.full_like(batch["policy_version"], 4))
    # μ are the generating snapshot's log-probs, not the learner's: the learner has moved since version 4
    assert not th.allclose(batch["behavior_per_token_logps"], batch["learner_per_token_logps"])
    assert _logged(trainer, "generation_lag")[-1] == 2.0
    assert _logged(trainer, "policy_lag")[-1] >= 2.0
    assert _logged(trainer, "tv_behavior")[-1] > 0.0


def test_grpo_baseline_under_lag_uses_behavior_ratio(tmp_path):
    trainer = _trainer(tmp_path, max_steps=6, steps_per_generation=2, policy_lag=2, loss_type="dapo")
    trainer.train()
    batch = trainer._buffered_inputs[0]
    assert th.equal(batch["old_per_token_logps"], batch["behavior_per_token_logps"])
    assert len(_logged(trainer, "clip_ratio/region_mean")) > 0  # TRL's own loss ran


def test_config_validation(tmp_path):
    with pytest.raises(ValueError, match="tv_reference"):
        VACOGRPOConfig(output_dir=str(tmp_path), tv_reference="nope", use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="policy_lag"):
        VACOGRPOConfig(output_dir=str(tmp_path), policy_lag=-1, use_cpu=True, report_to="none")
