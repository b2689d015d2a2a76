from typing import Any, ClassVar

import numpy as np
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.buffers import (
    MaskableDictRolloutBuffer,
    MaskableDictRolloutBufferSamples,
    MaskableRolloutBuffer,
    MaskableRolloutBufferSamples,
)
from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from sb3_vaco.common.buffers import LaggedRolloutBuffer
from sb3_vaco.common.lagged import LaggedOnPolicyAlgorithm


class LaggedMaskableRolloutBuffer(LaggedRolloutBuffer, MaskableRolloutBuffer):  # type: ignore[misc]
    """sb3-contrib's ``MaskableRolloutBuffer`` that also keeps what the lag needs (:class:`LaggedRolloutBuffer`)."""

    def _get_samples(  # type: ignore[override]
        self, batch_inds: np.ndarray, env: VecNormalize | None = None
    ) -> MaskableRolloutBufferSamples:
        # MaskablePPO's train() reads the maskable samples (the learner's log-probs are for the shared update loop)
        return MaskableRolloutBuffer._get_samples(self, batch_inds, env)


class LaggedMaskableDictRolloutBuffer(LaggedRolloutBuffer, MaskableDictRolloutBuffer):  # type: ignore[misc]
    """:class:`LaggedMaskableRolloutBuffer` for Dict observation spaces."""

    def _get_samples(  # type: ignore[override]
        self, batch_inds: np.ndarray, env: VecNormalize | None = None
    ) -> MaskableDictRolloutBufferSamples:
        return MaskableDictRolloutBuffer._get_samples(self, batch_inds, env)


class LaggedMaskablePPO(LaggedOnPolicyAlgorithm, MaskablePPO):  # type: ignore[misc]
    """
    sb3-contrib's MaskablePPO (invalid action masking, Huang & Ontañón, 2020, https://arxiv.org/abs/2006.14171), with
    its own ``train()`` unchanged, fed by lagged rollouts as :class:`~sb3_vaco.LaggedPPO` is: the stale policy acts
    with the step's action masks, and the buffer keeps the masks beside the behavior log-probs. With
    ``policy_lag=0`` it is MaskablePPO, bit for bit. Asynchronous actors (``n_actors > 0``) are not supported.

    Every argument of :class:`sb3_contrib.MaskablePPO`, with the same defaults, and ``policy_lag``.
    """

    lagged_buffer_classes: ClassVar[tuple[type[LaggedRolloutBuffer], type[LaggedRolloutBuffer]]] = (
        LaggedMaskableRolloutBuffer,
        LaggedMaskableDictRolloutBuffer,
    )
    _use_masking: bool = True

    def _setup_actors(self) -> None:
        if self.n_actors > 0:
            raise ValueError("`n_actors` must be 0 for LaggedMaskablePPO: the actors do not carry action masks")
        super()._setup_actors()

    def collect_rollouts(  # type: ignore[override]
        self,
        env: VecEnv,
        callback: BaseCallback,
        rollout_buffer: RolloutBuffer,
        n_rollout_steps: int,
        use_masking: bool = True,
    ) -> bool:
        """The lagged collection, with the action masks of every step when ``use_masking`` (MaskablePPO's ``learn``)."""
        if use_masking and not is_masking_supported(env):
            raise ValueError("Environment does not support action masking. Consider using ActionMasker wrapper")
        self._use_masking = use_masking
        return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)

    def _policy_inputs(self, env: VecEnv) -> dict[str, np.ndarray]:
        return {"action_masks": get_action_masks(env)} if self._use_masking else {}

    def _evaluation_inputs(self, rows: slice) -> dict[str, Any]:
        if not self._use_masking:
            return {}
        return {"action_masks": self.rollout_buffer.flat_array(self.rollout_buffer.action_masks)[rows]}  # type: ignore[attr-defined]
