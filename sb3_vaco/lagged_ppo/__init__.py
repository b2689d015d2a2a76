from sb3_vaco.lagged_ppo.lagged_ppo import LaggedPPO

__all__ = ["LaggedPPO"]
