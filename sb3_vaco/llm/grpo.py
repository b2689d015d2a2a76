"""
GRPO with VACO's total-variation filter instead of ratio clipping, and with injectable policy lag,
as a subclass of TRL's :class:`~trl.GRPOTrainer` (``loss_type="vaco"`` switches the loss, ``vaco_form`` chooses
among VACO's forms for LLMs).
"""

import copy
import inspect
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch as th
import trl
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import add_fused_lm_head, pad

from sb3_vaco.common.checks import Rule, check_hyperparameters
from sb3_vaco.common.ring import SnapshotRing
from sb3_vaco.llm.losses import (
    SAMPLER_CORRECTION_MODES,
    FilteredLoss,
    loss_mask,
    masked_total_variation,
    sampler_importance_ratio,
    vaco_decoupled_loss,
    vaco_sequence_loss,
    vaco_token_loss,
)

#: The numeric settings VACOGRPOConfig adds to GRPOConfig, checked as the SB3 algorithms check theirs
CONFIG_RULES = {
    "tv_threshold": Rule(low=0.0),
    "policy_lag": Rule(low=0, integer=True),
    "generation_ahead": Rule(low=0, integer=True),
}

#: VACO's forms for LLMs (``VACOGRPOConfig.vaco_form``), see :mod:`sb3_vaco.llm.losses`
VACO_FORMS = ("token", "sequence", "decoupled")

#: Default truncation ``ρ̄`` of ``π_T/μ`` per form: open-instruct's [0, 2] for TVPO, SB3's ``VACO`` decoupled ``min(1, ·)``
DEFAULT_RHO_BAR = {"token": math.inf, "sequence": 2.0, "decoupled": 1.0}

#: The TRL releases this trainer is tested with (``setup.cfg``'s ``llm`` extra says the same)
SUPPORTED_TRL = ">=1.16,<1.17"

#: The private members of TRL's ``GRPOTrainer`` this trainer relies on, with the parameters it passes them:
#: generation by another copy of the model and the log-prob forward have no public hook in TRL.
TRL_PRIVATE_METHODS: dict[str, tuple[str, ...]] = {
    "_generate_single_turn": ("self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"),
    "_get_per_token_logps_and_entropies": (
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
    ),
}


def check_trl(trainer_class: type = GRPOTrainer) -> None:
    """
    Raise an ImportError naming the supported TRL releases if ``trainer_class`` (TRL's ``GRPOTrainer``) lacks a
    private method :class:`VACOGRPOTrainer` overrides or calls, or takes other parameters than it passes.
    """
    for name, expected in TRL_PRIVATE_METHODS.items():
        method = getattr(trainer_class, name, None)
        found = None if method is None else tuple(inspect.signature(method).parameters)[: len(expected)]
        if found != expected:
            what = "missing" if found is None else f"({', '.join(found)})"
            raise ImportError(
                f"trl {trl.__version__}: GRPOTrainer.{name} is {what}, VACOGRPOTrainer needs ({', '.join(expected)}). "
                f"sb3_vaco.llm supports trl{SUPPORTED_TRL}: pip install 'trl{SUPPORTED_TRL}'"
            )


#: Where TRL's losses find the stale actor's log-probs (``VACOGRPOConfig.stale_actor_as``)
STALE_ACTOR_ROLES = ("sampler", "old_policy")

#: Deprecated ``tv_reference`` values and the form each one now is
LLM_TV_REFERENCES = {"behavior": "token", "learner": "decoupled", "decoupled": "decoupled"}


@dataclass
class VACOGRPOConfig(GRPOConfig):
    """
    :class:`~trl.GRPOConfig` with VACO's filter and injected policy lag. Every GRPO option keeps its meaning;
    ``loss_type="vaco"`` (the default here) replaces the clipped surrogate by one of VACO's forms, any of TRL's own
    loss types (``"dapo"``, ``"grpo"``, ...) runs unchanged on the same (possibly lagged) generations.

    :param vaco_form: which of VACO's forms (``μ``: the generating policy, ``π_T``: the learner when the batch
        entered training; formulas in :mod:`sb3_vaco.llm.losses`): ``"sequence"`` (the default; open-instruct's
        TVPO: PPO's clip on ``π_θ/π_T``, ``epsilon`` / ``epsilon_high``, weighted by ``min(π_T/μ, ρ̄)``, tokens that
        would increase a completion's TV over ``δ`` dropped), ``"token"`` (the paper's rule: TV filter on
        ``π_θ/μ``, one sample per token, no clip) or ``"decoupled"`` (TV filter on ``π_θ/π_T``, weighted by
        ``min(π_T/μ, ρ̄)``). The default is the form that kept GRPO's gain under lag in the demo's calibration
        (``docs/llm.md``); the unclipped forms were unstable there.
        ``importance_sampling_level="sequence"`` makes the ratio, the TV estimate and the mask of the ``"token"``
        and ``"decoupled"`` forms per completion (``exp`` of the mean token log-ratio, as in GSPO).
    :param tv_threshold: the TV budget ``δ``: per micro-batch (``"token"``, ``"decoupled"``) or per completion
        (``"sequence"``); always a TV, ``½·mean|ratio − 1|``
    :param filter_drift: the ``"sequence"`` form's TV test measures ``π_θ/μ`` (the lag plus the learner's drift
        during the update) instead of ``π_T/μ`` (the lag when the batch entered training)
    :param rho_bar: truncation ``ρ̄`` of the importance weight ``π_T/μ`` (``"sequence"`` and ``"decoupled"``;
        ``inf``: none); by default the form's own: 2 for ``"sequence"`` (open-instruct's), 1 for ``"decoupled"``
        (as SB3's ``VACO``)
    :param policy_lag: generate with the learner's parameters from ``K`` optimizer steps ago (a snapshot ring;
        ``0``: the learner generates, as in TRL)
    :param generation_ahead: generate each batch while the previous ``N`` train, as an asynchronous pipeline does
        (TRL's asynchronous GRPO, generation on its own workers): batch ``n`` is generated by the learner as it was
        when batch ``n − N`` entered training, a lag of ``N`` generation periods (``steps_per_generation ×
        num_iterations / gradient_accumulation_steps`` optimizer steps each). Exclusive with ``policy_lag``, which
        it sets; deterministic (the overlap is simulated, so runs are reproducible).
    :param stale_actor_as: where TRL's losses (``loss_type`` other than ``"vaco"``) find the stale actor under
        ``policy_lag``: ``"sampler"`` (the default) treats it as TRL treats vLLM: its log-probs ``μ`` are the batch's
        ``sampling_per_token_logps``, the ratio's anchor ``old_per_token_logps`` is the learner when the batch
        entered training ``π_T``, off-policy masking measures its KL to ``μ``, and TRL's sampler-mismatch correction
        (``vllm_importance_sampling_correction``, ``_mode``, ``_clip_min``, ``_clip_max``) weights the loss by
        ``π_T/μ`` as it would vLLM's; ``"old_policy"``: ``μ`` is ``old_per_token_logps``, so the ratio is taken to
        the generating policy and nothing corrects for the lag (what SB3's PPO does with a lagged rollout buffer).
        VACO's forms read ``μ`` and ``π_T`` themselves and ignore it.
    :param tv_reference: deprecated, use ``vaco_form``: ``"behavior"`` is ``"token"``, ``"decoupled"`` is
        ``"decoupled"``, ``"learner"`` is ``"decoupled"`` with ``rho_bar=inf``
    :param pg_rho_bar: deprecated, use ``rho_bar``
    """

    loss_type: str = field(
        default="vaco",
        metadata={"help": "'vaco' (VACO's filter, form chosen by vaco_form) or any of GRPOConfig's loss types."},
    )
    vaco_form: str = field(
        default="sequence", metadata={"help": "VACO's form for loss_type='vaco': 'sequence', 'token' or 'decoupled'."}
    )
    tv_threshold: float = field(default=0.2, metadata={"help": "TV budget δ (per micro-batch, or per completion)."})
    filter_drift: bool = field(
        default=False, metadata={"help": "'sequence' form: the TV test on π_θ/μ (lag and drift) instead of π_T/μ."}
    )
    rho_bar: float | None = field(
        default=None,
        metadata={"help": "Truncation of π_T/μ ('sequence' and 'decoupled' forms; default: 2 and 1 respectively)."},
    )
    policy_lag: int = field(default=0, metadata={"help": "Generate with the learner's parameters from K optimizer steps ago."})
    generation_ahead: int = field(
        default=0, metadata={"help": "Generate each batch while the previous N train (an asynchronous pipeline)."}
    )
    stale_actor_as: str = field(
        default="sampler",
        metadata={"help": "TRL's losses under lag: 'sampler' (the stale actor is treated as vLLM) or 'old_policy'."},
    )
    tv_reference: str | None = field(default=None, metadata={"help": "Deprecated: use vaco_form."})
    pg_rho_bar: float | None = field(default=None, metadata={"help": "Deprecated: use rho_bar."})

    @property
    def injected_lag(self) -> int:
        """The lag the trainer injects, in optimizer steps: ``policy_lag``, or ``generation_ahead`` generation periods."""
        if self.generation_ahead == 0:
            return self.policy_lag
        return self.generation_ahead * self._micro_steps_per_generation // self.gradient_accumulation_steps

    @property
    def _micro_steps_per_generation(self) -> int:
        """Micro-batches trained on one generation: ``steps_per_generation × num_iterations``."""
        return (self.steps_per_generation or 1) * self.num_iterations

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tv_reference is not None:
            if self.tv_reference not in LLM_TV_REFERENCES:
                raise ValueError(f"`tv_reference` must be one of {tuple(LLM_TV_REFERENCES)}, got {self.tv_reference!r}")
            warnings.warn("`tv_reference` is deprecated: use `vaco_form`", FutureWarning)
            self.vaco_form = LLM_TV_REFERENCES[self.tv_reference]
            if self.tv_reference == "learner":
                self.rho_bar = math.inf
        if self.pg_rho_bar is not None:
            warnings.warn("`pg_rho_bar` is deprecated: use `rho_bar`", FutureWarning)
            self.rho_bar = self.pg_rho_bar
        if self.vaco_form not in VACO_FORMS:
            raise ValueError(f"`vaco_form` must be one of {VACO_FORMS}, got {self.vaco_form!r}")
        if self.rho_bar is None:
            self.rho_bar = DEFAULT_RHO_BAR[self.vaco_form]
        if self.loss_type == "vaco" and self.vaco_form == "sequence" and self.importance_sampling_level != "token":
            raise ValueError(
                "vaco_form='sequence' (the default) takes token ratios: use importance_sampling_level='token', or "
                "vaco_form='token' / 'decoupled' for ratios per completion"
            )
        if self.filter_drift and self.vaco_form != "sequence":
            raise ValueError(f"`filter_drift` applies to vaco_form='sequence' only, got vaco_form={self.vaco_form!r}")
        check_hyperparameters({name: getattr(self, name) for name in CONFIG_RULES}, CONFIG_RULES)
        if not self.rho_bar > 0:
            raise ValueError(f"`rho_bar` must be > 0, got {self.rho_bar}")
        self._check_lag()

    def _check_lag(self) -> None:
        """The lag options and how TRL's losses see the stale actor."""
        if (self.policy_lag > 0 or self.generation_ahead > 0) and self.use_vllm:
            raise ValueError("policy lag is injected with transformers generation; vLLM has its own staleness")
        if self.generation_ahead > 0:
            if self.policy_lag > 0:
                raise ValueError("set `generation_ahead` or `policy_lag`, not both: generation_ahead sets the lag")
            micro_steps = self._micro_steps_per_generation
            if micro_steps % self.gradient_accumulation_steps:
                raise ValueError(
                    "`generation_ahead` needs whole optimizer steps between generations: make steps_per_generation × "
                    f"num_iterations ({micro_steps}) a multiple of gradient_accumulation_steps "
                    f"({self.gradient_accumulation_steps})"
                )
        if self.stale_actor_as not in STALE_ACTOR_ROLES:
            raise ValueError(f"`stale_actor_as` must be one of {STALE_ACTOR_ROLES}, got {self.stale_actor_as!r}")
        if self.vllm_importance_sampling_mode not in SAMPLER_CORRECTION_MODES:
            raise ValueError(
                f"`vllm_importance_sampling_mode` must be one of {SAMPLER_CORRECTION_MODES}, "
                f"got {self.vllm_importance_sampling_mode!r}"
            )
        corrects_stale_actor = self.injected_lag > 0 and self.stale_actor_as == "sampler"
        if (
            self.loss_type == "vespo"
            and corrects_stale_actor
            and self.vllm_importance_sampling_correction
            and not self.vllm_importance_sampling_mode.startswith("token")
        ):
            raise ValueError(
                "loss_type='vespo' takes the stale actor's correction per token, as TRL takes vLLM's: set "
                "vllm_importance_sampling_mode='token_truncate' or 'token_mask'"
            )


class _SnapshotCallback(TrainerCallback):
    """Pushes the learner's parameters into the trainer's snapshot ring after the optimizer steps that will act."""

    def __init__(self, trainer: "VACOGRPOTrainer") -> None:
        self.trainer = trainer

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.trainer._push_snapshot(state.global_step, force=True)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.trainer._push_snapshot(state.global_step)


class VACOGRPOTrainer(GRPOTrainer):
    """
    TRL's GRPO trainer with VACO's total-variation filter ("Align and Filter", Honari et al., 2026,
    https://arxiv.org/abs/2603.01365) and injectable policy lag.

    Advantages are GRPO's group-relative ones (no critic, hence no V-trace realignment). With
    ``loss_type="vaco"``, the loss of each micro-batch is one of VACO's forms (``vaco_form``), with ``μ`` the
    policy that generated the completion and ``π_T`` the learner when the batch entered training:

    * ``"sequence"`` (default), open-instruct's TVPO: clip on ``π_θ/π_T``, weight ``min(π_T/μ, ρ̄)``, tokens dropped
      where the completion's TV ``½·mean_t|π_T/μ − 1|`` exceeds ``δ`` and the update would increase it,
      :func:`~sb3_vaco.llm.losses.vaco_sequence_loss`;
    * ``"token"``, the paper's rule: TV filter on ``q_t = π_θ/μ``, no clip,
      :func:`~sb3_vaco.llm.losses.vaco_token_loss`;
    * ``"decoupled"``: TV filter on ``q_t = π_θ/π_T``, weight ``min(π_T/μ, ρ̄)``,
      :func:`~sb3_vaco.llm.losses.vaco_decoupled_loss`.

    Policy lag (``policy_lag=K``): the learner's parameters are snapshotted (on CPU) after the optimizer steps
    whose version will act, and each generation batch is sampled by a separate copy of the model loaded
    with the parameters of ``K`` optimizer steps ago. The stale copy plays the part vLLM plays in TRL: its
    log-probs ``μ`` are the batch's ``sampling_per_token_logps``, and ``π_T`` is TRL's ``old_per_token_logps``
    (or the learner itself when the optimizer steps are aligned with the generations). TRL's own loss types see
    it as ``stale_actor_as`` says: as vLLM, with TRL's sampler-mismatch correction (the default), or as the
    ratio's anchor (``old_per_token_logps := μ``, as SB3's PPO with a lagged rollout buffer).

    Logged (under ``train/`` in TensorBoard / W&B): ``policy_lag`` (optimizer steps between the generating
    policy and the one being updated, per micro-batch), ``generation_lag`` (staleness when generated),
    ``tv_behavior`` (``½·mean|π_T/μ − 1|`` of the stale batches), ``sampler_correction`` (TRL's losses: the mean
    correction weight), and for ``"vaco"``: ``tv_estimate``,
    ``filtered_fraction``, ``filter_active_fraction``, ``tv_to_behavior`` (``½·mean|π_θ/μ − 1|``), and for the
    ``"sequence"`` and ``"decoupled"`` forms ``importance_weight`` (mean weight of the valid tokens, dropped ones
    as 0) and for ``"sequence"`` ``clip_ratio/region_mean`` (as TRL's).

    The filter's minibatch is a micro-batch (one ``per_device_train_batch_size`` slice on one process): under
    gradient accumulation the TV test runs per micro-batch. Not supported with ``"vaco"``: adaptive entropy,
    ``top_entropy_quantile < 1``, ``off_policy_mask_threshold``. With vLLM, ``μ`` is vLLM's sampling log-prob.

    Takes :class:`~trl.GRPOTrainer`'s arguments, with ``args`` a :class:`VACOGRPOConfig`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_trl()
        super().__init__(*args, **kwargs)
        config = self.args
        if not isinstance(config, VACOGRPOConfig):
            raise TypeError(f"`args` must be a VACOGRPOConfig, got {type(config).__name__}")
        if self.loss_type == "vaco":
            if config.use_adaptive_entropy or config.top_entropy_quantile < 1.0 or config.off_policy_mask_threshold:
                raise ValueError(
                    "loss_type='vaco' does not support use_adaptive_entropy, top_entropy_quantile < 1 or "
                    "off_policy_mask_threshold"
                )
        self._steps_per_generation = int(config.steps_per_generation or 1)  # set by GRPOConfig.__post_init__
        self._cast_lm_head_to_fp32 = config.cast_lm_head_to_fp32
        self.tv_threshold = config.tv_threshold
        self.vaco_form = config.vaco_form
        self.filter_drift = config.filter_drift
        assert config.rho_bar is not None  # set by VACOGRPOConfig.__post_init__
        self.rho_bar = float(config.rho_bar)
        self.policy_lag = config.injected_lag
        # On CPU: a stale copy costs host memory, not accelerator memory.
        self._snapshots = SnapshotRing(device="cpu") if self.policy_lag > 0 else None
        self._actor: Any = None
        self._actor_version: int | None = None
        self._generation_version = 0  # the optimizer step of the parameters that generated the buffered batch
        # (learner version at generation, version of the policy that generated), one entry per generation batch
        self.generation_versions: list[tuple[int, int]] = []
        if self._snapshots is not None:
            self.add_callback(_SnapshotCallback(self))

    def _training(self) -> bool:
        return self.model is not None and self.model.training

    # ----- policy lag ---------------------------------------------------------------------------------------

    def _snapshot_needed(self, version: int) -> bool:
        """Whether a generation will happen at learner version ``version + K`` (so this version will act)."""
        target = version + self.policy_lag
        micro_steps = self.args.gradient_accumulation_steps
        generate_every = self._steps_per_generation * self.num_iterations  # micro-steps between generations
        # Generations happen after n·generate_every micro-steps, i.e. at optimizer step ⌊n·generate_every / A⌋.
        n = -(-target * micro_steps // generate_every)
        return (n * generate_every) // micro_steps == target

    def _push_snapshot(self, version: int, force: bool = False) -> None:
        if self._snapshots is not None and (force or self._snapshot_needed(version)):
            self._snapshots.push(version, self.accelerator.unwrap_model(self.model))

    def _load_actor(self, version: int, params: dict[str, th.Tensor]) -> Any:
        """The acting copy of the model, loaded with the parameters of ``version``."""
        if self._actor is None:
            actor = copy.deepcopy(self.accelerator.unwrap_model(self.model))
            # TRL patches the instance's forward with a fused LM head whose closure calls the *learner's* original
            # forward: drop the copied patch and patch the copy itself.
            actor.__dict__.pop("forward", None)
            add_fused_lm_head(actor, temperature=self.temperature, cast_lm_head_to_fp32=self._cast_lm_head_to_fp32)
            actor.requires_grad_(False)
            actor.eval()
            self._actor = actor
        if self._actor_version != version:
            self._actor.load_state_dict(params)
            self._actor_version = version
        return self._actor

    def _generate_single_turn(
        self,
        prompt_ids: list[list[int]],
        images: Any,
        multimodal_fields: dict[str, Any],
        num_generations: int,
        has_tool_images: bool = False,
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        """
        TRL's generation, by the snapshot of ``policy_lag`` optimizer steps ago when there is one. The stale copy
        returns its per-token log-probs ``μ`` in the slot where vLLM returns its own, so TRL stores them as the
        batch's ``sampling_per_token_logps``. (Overrides a private TRL method: TRL has no public hook to generate
        with another copy of the model; tests/test_llm.py checks its signature.)
        """
        self._generation_version = self.state.global_step
        if self._snapshots is None or not self._training():
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if images is not None or multimodal_fields:
            raise NotImplementedError("policy_lag is implemented for text-only models")
        version, params = self._snapshots.select(self.state.global_step - self.policy_lag)
        self._snapshots.drop_before(version)  # requests never go back in time
        self._generation_version = version
        self.generation_versions.append((self.state.global_step, version))
        self._metrics["train"]["generation_lag"].append(float(self.state.global_step - version))
        if version == self.state.global_step:  # nothing older yet: the learner acts
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        actor = self._load_actor(version, params)

        device = self.accelerator.device
        multiple = self.pad_to_multiple_of if isinstance(self.pad_to_multiple_of, int) else None
        prompts = [th.tensor(ids) for ids in prompt_ids]
        input_ids = pad(prompts, self._tokenizer.pad_token_id, padding_side="left", pad_to_multiple_of=multiple).to(device)
        prompt_mask = pad([th.ones_like(ids) for ids in prompts], 0, padding_side="left", pad_to_multiple_of=multiple)
        prompt_mask = prompt_mask.to(device)
        with th.no_grad():
            generated = actor.generate(
                input_ids=input_ids, attention_mask=prompt_mask, generation_config=self.generation_config
            )
        completions = generated[:, input_ids.size(1) :]
        # Keep everything up to and including the first EOS, as TRL does
        is_eos = th.isin(completions, th.tensor(self.eos_token_ids, device=completions.device))
        lengths = th.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, completions.size(1)).tolist()
        completion_ids = [row[:length].tolist() for row, length in zip(completions.cpu(), lengths, strict=True)]
        # μ on the batch layout TRL builds for the loss (left-padded prompts, right-padded completions)
        padded = pad([th.tensor(ids) for ids in completion_ids], self._tokenizer.pad_token_id, pad_to_multiple_of=multiple)
        completion_mask = pad([th.ones(len(ids), dtype=th.long) for ids in completion_ids], 0, pad_to_multiple_of=multiple)
        logps = self._score(actor, input_ids, prompt_mask, padded.to(device), completion_mask.to(device))
        return completion_ids, [row[:length].tolist() for row, length in zip(logps.cpu(), lengths, strict=True)]

    @th.no_grad()
    def _score(
        self,
        model: Any,
        prompt_ids: th.Tensor,
        prompt_mask: th.Tensor,
        completion_ids: th.Tensor,
        completion_mask: th.Tensor,
    ) -> th.Tensor:
        """Per-token log-probs of the completions under ``model``, by the same forward as the loss."""
        logps, _, _ = self._get_per_token_logps_and_entropies(
            model,
            th.cat([prompt_ids, completion_ids], dim=1),
            th.cat([prompt_mask, completion_mask], dim=1),
            completion_ids.size(1),
            batch_size=self.args.per_device_train_batch_size,
        )
        return logps

    def _learner_logps(self, model: Any, inputs: dict[str, Any]) -> th.Tensor:
        """``π_T``: TRL's ``old_per_token_logps``, else (steps aligned with generations: TRL skips them) the learner now."""
        old = inputs.get("old_per_token_logps")
        if old is not None:
            return old
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        return self._score(model, prompt_ids, prompt_mask, inputs["completion_ids"], inputs["completion_mask"])

    # ----- loss ---------------------------------------------------------------------------------------------

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> th.Tensor:
        """
        TRL's loss, on the stale actor's batch as ``stale_actor_as`` says (:class:`VACOGRPOConfig`), or with
        ``loss_type="vaco"`` the selected VACO form; logs ``policy_lag`` and, under lag, ``tv_behavior``.
        """
        mode = "train" if self._training() else "eval"
        if mode == "train":
            self._metrics[mode]["policy_lag"].append(float(self.state.global_step - self._generation_version))
        if self.loss_type == "vaco":
            if return_outputs:
                raise ValueError("The GRPOTrainer does not support returning outputs")
            return self._compute_vaco_loss(model, inputs, mode)
        if inputs.get("sampling_per_token_logps") is not None and not self.use_vllm:
            inputs = self._stale_actor_inputs(model, inputs, mode)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _stale_actor_inputs(self, model: Any, inputs: dict[str, Any], mode: str) -> dict[str, Any]:
        """
        The batch as TRL's losses should see the stale actor: as vLLM (``"sampler"``), with TRL's sampler-mismatch
        correction, or as the ratio's anchor (``"old_policy"``).

        TRL applies the correction only when it runs vLLM itself, multiplying each token's loss by ``ρ``. Every
        TRL loss but VESPO is positively homogeneous in the advantage (``ρ ≥ 0`` keeps its sign, which is all that
        the clip, SAPO's temperatures and off-policy masking read), so it is TRL's own loss with ``Â·ρ`` in place
        of ``Â``; VESPO reads ``importance_sampling_ratio`` from the batch, where TRL puts vLLM's.
        """
        args = self.args
        assert isinstance(args, VACOGRPOConfig)  # checked in __init__
        inputs = dict(inputs)
        mask = loss_mask(inputs)
        learner = self._learner_logps(model, inputs)
        sampling = inputs["sampling_per_token_logps"]
        behavior = th.where(th.isnan(sampling), learner, sampling)  # tokens the sampler could not score: no lag
        tv = masked_total_variation(learner - behavior, mask)
        self._metrics[mode]["tv_behavior"].append(self.accelerator.gather(tv).mean().item())
        if args.stale_actor_as == "old_policy":
            del inputs["sampling_per_token_logps"]
            inputs["old_per_token_logps"] = behavior
            return inputs
        if self.off_policy_mask_threshold is not None:  # TRL's mask as the batch enters training (π_θ = π_T)
            advantages = inputs["advantages"]
            keep = self.get_off_policy_mask(
                advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,
                learner,
                behavior,
                mask,
                self.off_policy_mask_threshold,
            )
            has_tokens = (mask.sum(dim=1, keepdim=True) > 0).float()
            dropped = ((1.0 - keep) * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)
            self._metrics[mode]["off_policy_mask/dropped_fraction"].append(self.accelerator.gather(dropped).mean().item())
        if not args.vllm_importance_sampling_correction:
            return inputs
        rho = sampler_importance_ratio(
            learner,
            sampling,
            mask,
            args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max,
        )
        if self.loss_type == "vespo":
            inputs["importance_sampling_ratio"] = rho
        else:
            advantages = inputs["advantages"]
            advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
            inputs["advantages"] = advantages * rho.expand_as(mask)
        correction = (rho.expand_as(mask) * mask).sum() / mask.sum().clamp(min=1.0)
        self._metrics[mode]["sampler_correction"].append(self.accelerator.gather(correction).mean().item())
        return inputs

    def _vaco_loss(
        self,
        per_token_logps: th.Tensor,
        proximal: th.Tensor,
        behavior: th.Tensor,
        advantages: th.Tensor,
        mask: th.Tensor,
    ) -> FilteredLoss:
        """The selected form's loss (:mod:`sb3_vaco.llm.losses`) on ``log π_θ``, ``log π_T`` and ``log μ``."""
        sequence_ratio = self.importance_sampling_level == "sequence"
        if self.vaco_form == "token":
            return vaco_token_loss(per_token_logps, behavior, advantages, mask, self.tv_threshold, sequence_ratio)
        if self.vaco_form == "decoupled":
            return vaco_decoupled_loss(
                per_token_logps, proximal, behavior, advantages, mask, self.tv_threshold, self.rho_bar, sequence_ratio
            )
        return vaco_sequence_loss(
            per_token_logps,
            proximal,
            behavior,
            advantages,
            mask,
            self.tv_threshold,
            self.rho_bar,
            self.epsilon_low,
            self.epsilon_high,
            self.filter_drift,
        )

    def _compute_vaco_loss(self, model: Any, inputs: dict[str, Any], mode: str) -> th.Tensor:
        """The selected VACO form on GRPO's advantages (see the class docstring), plus KL / entropy terms."""
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        mask = loss_mask(inputs)
        per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model,
            th.cat([prompt_ids, completion_ids], dim=1),
            th.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
            completion_ids.size(1),
            compute_entropy=True,
            token_type_ids=inputs.get("token_type_ids"),
            mm_token_type_ids=inputs.get("mm_token_type_ids"),
        )
        proximal = inputs.get("old_per_token_logps")
        proximal = per_token_logps.detach() if proximal is None else proximal  # steps aligned: π_T = π_θ
        behavior = inputs.get("sampling_per_token_logps")  # the stale actor's, vLLM's or a rollout_func's
        behavior = proximal if behavior is None else th.where(th.isnan(behavior), proximal, behavior)
        filtered = self._vaco_loss(per_token_logps, proximal, behavior, inputs["advantages"], mask)
        loss = filtered.loss

        def masked_mean(x: th.Tensor) -> th.Tensor:
            return (x * mask).sum() / mask.sum().clamp(min=1.0)

        if self.beta != 0.0:
            ref_log_ratio = inputs["ref_per_token_logps"] - per_token_logps
            kl = masked_mean(th.exp(ref_log_ratio) - ref_log_ratio - 1.0)
            loss = loss + self.beta * kl
            self._metrics[mode]["kl"].append(self.accelerator.gather(kl.detach()).mean().item())
        if self.entropy_coef != 0.0:
            loss = loss - self.entropy_coef * masked_mean(entropies)

        gather = self.accelerator.gather
        with th.no_grad():
            tv_to_behavior = masked_total_variation(per_token_logps - behavior, mask)
            if "sampling_per_token_logps" in inputs:
                tv_behavior = masked_total_variation(proximal - behavior, mask)
                self._metrics[mode]["tv_behavior"].append(gather(tv_behavior).mean().item())
            valid = mask if filtered.mask.shape[1] > 1 else (mask.sum(dim=1, keepdim=True) > 0).float()
            filtered_fraction = 1.0 - filtered.mask.sum() / valid.sum().clamp(min=1.0)
            if filtered.weights is not None:
                weight = (filtered.weights * valid).sum() / valid.sum().clamp(min=1.0)
                self._metrics[mode]["importance_weight"].append(gather(weight).mean().item())
        if self.vaco_form == "sequence":
            self._metrics[mode]["clip_ratio/region_mean"].append(filtered.clip_fraction)
        self._metrics[mode]["tv_estimate"].append(gather(filtered.tv_estimate.detach()).mean().item())
        self._metrics[mode]["filtered_fraction"].append(gather(filtered_fraction).mean().item())
        self._metrics[mode]["filter_active_fraction"].append(filtered.filter_active)
        self._metrics[mode]["tv_to_behavior"].append(gather(tv_to_behavior.to(mask.device)).mean().item())
        self._metrics[mode]["entropy"].append(gather(masked_mean(entropies).detach()).mean().item())

        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        return loss / normalizer
