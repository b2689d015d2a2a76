"""
VACO for LLM RL with TRL (the optional ``sb3_vaco[llm]`` extra): GRPO with VACO's forms (token-level TV filter,
sequence-level TVPO, decoupled) and injectable policy lag. Not imported by ``sb3_vaco``.
"""

from sb3_vaco.common.ring import SnapshotRing
from sb3_vaco.llm.grpo import SUPPORTED_TRL, VACO_FORMS, VACOGRPOConfig, VACOGRPOTrainer, check_trl
from sb3_vaco.llm.losses import (
    masked_tv_filtered_surrogate,
    sampler_importance_ratio,
    vaco_decoupled_loss,
    vaco_sequence_loss,
    vaco_token_loss,
)

__all__ = [
    "SUPPORTED_TRL",
    "VACO_FORMS",
    "SnapshotRing",
    "VACOGRPOConfig",
    "VACOGRPOTrainer",
    "check_trl",
    "masked_tv_filtered_surrogate",
    "sampler_importance_ratio",
    "vaco_decoupled_loss",
    "vaco_sequence_loss",
    "vaco_token_loss",
]
