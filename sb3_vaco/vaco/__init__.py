from sb3_vaco.vaco.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_vaco.vaco.vaco import VACO

__all__ = ["VACO", "CnnPolicy", "MlpPolicy", "MultiInputPolicy"]
