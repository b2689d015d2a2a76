from sb3_vaco.baselines import PPOKL, SPO, VACOAlignOnly, VACOFilterOnly
from sb3_vaco.lagged import LaggedMaskablePPO, LaggedPPO, LaggedTRPO
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
    "LaggedMaskablePPO",
    "LaggedPPO",
    "LaggedTRPO",
    "VACOAlignOnly",
    "VACOFilterOnly",
    "__version__",
]
