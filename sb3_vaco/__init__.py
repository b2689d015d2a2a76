from sb3_vaco.baselines import PPOKL, SPO, VACOAlignOnly, VACOFilterOnly
from sb3_vaco.lagged import LaggedPPO, LaggedTRPO
from sb3_vaco.peers import APPO, IMPALA, DecoupledPPO
from sb3_vaco.vaco import VACO
from sb3_vaco.version import __version__

__all__ = [
    "APPO",
    "IMPALA",
    "PPOKL",
    "SPO",
    "VACO",
    "DecoupledPPO",
    "LaggedPPO",
    "LaggedTRPO",
    "VACOAlignOnly",
    "VACOFilterOnly",
    "__version__",
]
