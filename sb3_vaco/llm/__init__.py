"""
VACO for LLM RL with TRL (the optional ``sb3_vaco[llm]`` extra): GRPO with the total-variation filter and
injectable policy lag. Not imported by ``sb3_vaco``.
"""

from sb3_vaco.common.lag import SnapshotRing
from sb3_vaco.llm.grpo import VACOGRPOConfig, VACOGRPOTrainer
from sb3_vaco.llm.losses import masked_tv_filtered_surrogate

__all__ = ["SnapshotRing", "VACOGRPOConfig", "VACOGRPOTrainer", "masked_tv_filtered_surrogate"]
