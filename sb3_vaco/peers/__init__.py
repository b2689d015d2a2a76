from sb3_vaco.peers.appo import APPO
from sb3_vaco.peers.decoupled_ppo import DecoupledPPO
from sb3_vaco.peers.impala import IMPALA

__all__ = ["APPO", "IMPALA", "DecoupledPPO"]
