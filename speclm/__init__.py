"""speclm: lossless speculative decoding on real models."""

from .api import LLM, SpecConfig
from .errors import InvalidRequestError, ModelError, SpeclmError, TokenizerMismatchError
from .metrics import GenerationResult
from .sampling import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "SpecConfig", "GenerationResult", "SpeclmError",
           "InvalidRequestError", "ModelError", "TokenizerMismatchError"]
