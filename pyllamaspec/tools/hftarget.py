"""A Hugging Face model directory read as a conversion target, without converting its weights.

A drafter GGUF needs three things from its target: sizes, the arch (both for the pairing verdict, which is
ggufinfo.pairing's, tappable archs included) and the tokenizer (llama.cpp loads a vocabulary with every model).
config.json gives the first two; the tokenizer is rebuilt from tokenizer.json the way a GGUF target made from the
same directory carries it: the byte-level BPE vocabulary in id order padded to the config's vocab_size, token
types, merges, special token ids, add-BOS/EOS flags and the chat template (the last three read by gguf's
SpecialVocab).

Only byte-level BPE tokenizers (Qwen, Llama 3, gpt-oss and their kin) are rebuilt here; for anything else the
error says to pass the target as GGUF.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConversionError

# HF model_type -> llama.cpp arch, for the byte-level BPE families whose tokenizer this module rebuilds. Whether
# a drafter can tap an arch's layers is the pairing verdict's (ggufinfo.pairing.LAYER_INPUT_ARCHS): qwen2 reads
# fine here and is then refused there, as it is for a qwen2 GGUF.
HF_MODEL_TYPES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "qwen3_next": "qwen3next",
    "qwen3_5": "qwen35",
    "qwen3_5_text": "qwen35",
    "qwen3_5_moe": "qwen35moe",
    "qwen3_5_moe_text": "qwen35moe",
    "gpt_oss": "gpt-oss",
}

# tokenizer.ggml.pre llama.cpp expects for each arch's tokenizer (names from upstream's llama-vocab.cpp)
PRE_TOKENIZERS = {
    "llama": "llama-bpe",
    "qwen2": "qwen2",
    "qwen3": "qwen2",
    "qwen3moe": "qwen2",
    "qwen3next": "qwen2",
    "qwen35": "qwen35",
    "qwen35moe": "qwen35",
    "gpt-oss": "gpt-4o",
}

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


@dataclass
class HFTarget:
    path: Path
    arch: str
    name: str
    n_embd: int
    n_layer: int          # trunk layers (the ones a drafter can tap)
    n_layer_nextn: int    # MTP layers a GGUF of this target would append to the block count
    uses_mrope: bool
    tokens: list[bytes]
    tokenizer_kv: list[tuple[str, Any, Any, Any]]  # key, value, vtype, sub_type - as convert writes them

    @property
    def vocab_fingerprint(self) -> str:
        """ggufinfo's token fingerprint: sha256 of the token array as GGUF serialises it."""
        h = hashlib.sha256()
        for t in self.tokens:
            h.update(struct.pack("<Q", len(t)))
            h.update(t)
        return h.hexdigest()


def is_hf_model_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def _load_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConversionError(f"target directory {str(path.parent)!r} has no {path.name} ({what})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"cannot read {str(path)!r}: {e}") from None


def _text_config(config: dict) -> dict:
    """Multimodal checkpoints (e.g. Qwen3.5) keep the language model's sizes under text_config."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def _int_field(config: dict, name: str, path: Path) -> int:
    value = config.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConversionError(f"target {str(path / 'config.json')!r}: {name} must be a positive integer, got {value!r}")
    return value


def _uses_mrope(config: dict) -> bool:
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if isinstance(rope, dict) and rope.get("mrope_section"):
            return True
    return False


def _tokens_and_types(tokenizer: dict, n_vocab: int, path: Path) -> tuple[list[bytes], list[int]]:
    model = tokenizer.get("model") or {}
    pre = json.dumps(tokenizer.get("pre_tokenizer") or {})
    if model.get("type") != "BPE" or "ByteLevel" not in pre:
        raise ConversionError(
            f"target {str(path)!r}: its tokenizer is not byte-level BPE (model type {model.get('type')!r}); only "
            f"Qwen/Llama-3/gpt-oss style tokenizers are read from a directory - pass the target as GGUF instead")
    by_id: dict[int, str] = {}
    for text, i in (model.get("vocab") or {}).items():
        by_id[int(i)] = text
    kinds: dict[int, int] = {}
    for added in tokenizer.get("added_tokens") or []:
        i, text = int(added["id"]), str(added["content"])
        by_id[i] = text
        looks_special = text.startswith("<|") and text.endswith("|>")
        kinds[i] = TOKEN_CONTROL if added.get("special") or looks_special else TOKEN_USER_DEFINED
    if not by_id:
        raise ConversionError(f"target {str(path)!r}: tokenizer.json has an empty vocabulary")
    top = max(by_id)
    if top >= n_vocab:
        raise ConversionError(f"target {str(path)!r}: tokenizer.json has token id {top}, but config.json's vocab_size "
                              f"is {n_vocab}")
    tokens, types = [], []
    for i in range(n_vocab):
        if i in by_id:
            tokens.append(by_id[i].encode("utf-8"))
            types.append(kinds.get(i, TOKEN_NORMAL))
        else:  # ids the embedding matrix has but the tokenizer never produces
            tokens.append(f"[PAD{i}]".encode())
            types.append(TOKEN_UNUSED)
    return tokens, types


def read_hf_target(path: Path) -> HFTarget:
    """Sizes, arch and tokenizer of a Hugging Face model directory, checked as far as a drafter needs them."""
    import gguf
    from gguf import GGUFValueType as T

    path = Path(path)
    config = _load_json(path / "config.json", "the model's configuration")
    if not isinstance(config, dict):
        raise ConversionError(f"target {str(path / 'config.json')!r} is not a JSON object")
    text = _text_config(config)
    model_type = str(text.get("model_type") or "")  # the language model's own type when text_config has one
    arch = HF_MODEL_TYPES.get(model_type)
    if arch is None:
        known = ", ".join(sorted(HF_MODEL_TYPES))
        raise ConversionError(f"target {str(path)!r}: model_type {model_type!r} is not one this converter reads from a "
                              f"directory ({known}); pass the target as GGUF")
    n_embd = _int_field(text, "hidden_size", path)
    n_layer = _int_field(text, "num_hidden_layers", path)
    n_vocab = _int_field(text, "vocab_size", path)
    nextn = text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0

    tokenizer = _load_json(path / "tokenizer.json", "the tokenizer the drafter GGUF must carry")
    tokens, types = _tokens_and_types(tokenizer, n_vocab, path)
    special = gguf.SpecialVocab(path, load_merges=True, n_vocab=n_vocab)
    if not special.merges:
        raise ConversionError(f"target {str(path)!r}: tokenizer.json has no BPE merges")

    kv: list[tuple[str, Any, Any, Any]] = [
        ("tokenizer.ggml.model", b"gpt2", T.STRING, None),
        ("tokenizer.ggml.pre", PRE_TOKENIZERS[arch].encode(), T.STRING, None),
        ("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING),
        ("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32),
        ("tokenizer.ggml.merges", [m.encode("utf-8") for m in special.merges], T.ARRAY, T.STRING),
    ]
    keys = gguf.Keys.Tokenizer
    # no mask: the drafter's own mask token is written instead
    id_keys = {"bos": keys.BOS_ID, "eos": keys.EOS_ID, "unk": keys.UNK_ID, "sep": keys.SEP_ID, "pad": keys.PAD_ID}
    for kind, token_id in sorted(special.special_token_ids.items()):
        if kind in id_keys:
            kv.append((id_keys[kind], int(token_id), T.UINT32, None))
    for kind, flag in sorted(special.add_special_token.items()):
        kv.append((f"tokenizer.ggml.add_{kind}_token", bool(flag), T.BOOL, None))
    if isinstance(special.chat_template, str) and special.chat_template:
        kv.append(("tokenizer.chat_template", special.chat_template.encode("utf-8"), T.STRING, None))
    return HFTarget(path=path, arch=arch, name=path.name, n_embd=n_embd, n_layer=n_layer,
                    n_layer_nextn=int(nextn), uses_mrope=_uses_mrope(text), tokens=tokens, tokenizer_kv=kv)
