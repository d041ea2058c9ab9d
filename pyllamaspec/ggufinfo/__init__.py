"""GGUF metadata and the pairing verdict: the one GGUF reader (reader), what a file declares (summary), and
whether a target and a drafter can run together (pairing). Headers only, never weights; no native code."""

from .pairing import (PairingProblem, PairingReport, check_pair, detect_spec_types, require_pair,
                      tappable_layer_range)
from .reader import GGUFFile, TensorInfo, check_model_file, open_gguf, token_fingerprint, tokenizer_kv
from .summary import GGUFSummary, read_summary

__all__ = [
    "GGUFFile", "GGUFSummary", "PairingProblem", "PairingReport", "TensorInfo", "check_model_file", "check_pair",
    "detect_spec_types", "open_gguf", "read_summary", "require_pair", "tappable_layer_range", "token_fingerprint",
    "tokenizer_kv",
]
