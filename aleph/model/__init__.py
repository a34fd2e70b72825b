"""aleph.model: the AlephLM-0 encoder, its arms, the distillation objective, weight I/O."""

from aleph.model.config import ARMS, ModelConfig
from aleph.model.encoder import AlephEncoder, build_model, count_parameters

__all__ = ["ARMS", "AlephEncoder", "ModelConfig", "build_model", "count_parameters"]
