from sb3_vaco.baselines.baselines import PPOKL, SPO, VACOAlignOnly, VACOFilterOnly

__all__ = ["PPOKL", "SPO", "VACOAlignOnly", "VACOFilterOnly"]
