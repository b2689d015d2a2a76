from sb3_vaco.common.actors.base import ActorBackend, ActorSettings, ActorSpec, Segment, parse_actor_settings
from sb3_vaco.common.actors.pool import ActorBatch, ActorPool

__all__ = ["ActorBackend", "ActorBatch", "ActorPool", "ActorSettings", "ActorSpec", "Segment", "parse_actor_settings"]
