"""pyllamaspec: fast, exact speculative decoding of GGUF models, with llama.cpp inside.

    from pyllamaspec import Model, SpecSession, SessionConfig

    target = Model("target.gguf")
    drafter = Model("drafter.gguf")
    with SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], n_max=8)) as s:
        for piece in s.stream("def fib(n):", n_predict=64):
            print(piece, end="")
"""

from .errors import *  # noqa: F401,F403  (the exception hierarchy is part of the API)
from .config import ModelConfig, SessionConfig, SPEC_TYPES
from .model import Model
from .session import GenerationResult, SpecSession, Stats
from .embedding import Embedder
from .buildinfo import info

__version__ = "0.1.0"

__all__ = [
    "Embedder", "Model", "ModelConfig", "SessionConfig", "SPEC_TYPES", "SpecSession", "GenerationResult", "Stats", "info",
    "__version__",
]
