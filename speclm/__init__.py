"""speclm: lossless speculative decoding on real models."""

from .api import LLM, SpecConfig
from .constraints import Grammar
from .errors import InvalidRequestError, ModelError, SpeclmError, TokenizerMismatchError
from .metrics import GenerationResult
from .sampling import SamplingParams
from .speculative.proposers.medusa import MedusaOptions
from .speculative.ssd.options import SSDOptions

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "Grammar", "SpecConfig", "SSDOptions", "MedusaOptions", "GenerationResult", "SpeclmError",
           "InvalidRequestError", "ModelError", "TokenizerMismatchError"]
