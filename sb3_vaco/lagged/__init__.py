from sb3_vaco.lagged.lagged_maskable_ppo import LaggedMaskablePPO
from sb3_vaco.lagged.lagged_ppo import LaggedPPO
from sb3_vaco.lagged.lagged_trpo import LaggedTRPO

__all__ = ["LaggedMaskablePPO", "LaggedPPO", "LaggedTRPO"]
