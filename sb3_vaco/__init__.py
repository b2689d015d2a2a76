from sb3_vaco.baselines import PPOKL, SPO, VACOAlignOnly, VACOFilterOnly
from sb3_vaco.lagged_ppo import LaggedPPO
from sb3_vaco.vaco import VACO
from sb3_vaco.version import __version__

__all__ = ["PPOKL", "SPO", "VACO", "LaggedPPO", "VACOAlignOnly", "VACOFilterOnly", "__version__"]
