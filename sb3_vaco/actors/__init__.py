from sb3_vaco.actors.base import ActorBackend, ActorSettings, ActorSpec, Segment, parse_actor_settings
from sb3_vaco.actors.pool import ActorBatch, ActorPool

__all__ = ["ActorBackend", "ActorBatch", "ActorPool", "ActorSettings", "ActorSpec", "Segment", "parse_actor_settings"]
