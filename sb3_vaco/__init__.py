from sb3_vaco.lagged_ppo import LaggedPPO
from sb3_vaco.vaco import VACO
from sb3_vaco.version import __version__

__all__ = ["VACO", "LaggedPPO", "__version__"]
