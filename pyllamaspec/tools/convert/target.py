"""The conversion target: a GGUF, or a Hugging Face model directory (hftarget). What the drafter GGUF takes
from it (sizes, tokenizer, fingerprint) and the pairing verdict on the drafter about to be written, which is
ggufinfo.pairing's, told in the terms of the drafter's config.json."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConversionError, PairingError, PyllamaspecError
from ...ggufinfo import GGUFSummary, check_pair, open_gguf, tappable_layer_range
from ...ggufinfo.summary import role_of, summarise
from ..hftarget import is_hf_model_dir, read_hf_target
from .config import DrafterSpec

ARCH = "dflash"


def target_fingerprint(vocab_fingerprint: str, n_embd: int, n_layer: int) -> str:
    """sha256 (hex) identifying a target for pairing: its vocabulary, n_embd and n_layer.

    ``vocab_fingerprint`` is the token fingerprint of the target (``pyllamaspec.ggufinfo``: sha256 over the
    serialised ``tokenizer.ggml.tokens`` array, each token's u64 length then its bytes), ``n_embd`` is
    ``{arch}.embedding_length`` and ``n_layer`` is ``{arch}.block_count`` as stored (MTP/nextn blocks
    included). The fingerprint is sha256 over ``"pyllamaspec.target.v1\\0<vocab_fingerprint>\\0<n_embd>\\0<n_layer>"``
    (decimal numbers), so ``target_fingerprint_of(read_summary(target))`` recomputes what the converter wrote.
    """
    text = f"pyllamaspec.target.v1\0{vocab_fingerprint}\0{int(n_embd)}\0{int(n_layer)}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def target_fingerprint_of(summary: GGUFSummary) -> str | None:
    """``target_fingerprint`` of a GGUFSummary; None if it lacks a token list or sizes."""
    if summary.vocab_fingerprint is None or summary.n_embd is None or summary.n_layer is None:
        return None
    return target_fingerprint(summary.vocab_fingerprint, summary.n_embd, summary.n_layer)


@dataclass
class Target:
    path: Path
    summary: GGUFSummary  # what pairing judges (for a directory: what a GGUF of it would declare)
    name: str
    uses_mrope: bool
    fingerprint: str
    tokenizer_kv: list[tuple[str, Any, Any, Any]] = field(default_factory=list)  # key, value, vtype, sub_type

    @property
    def arch(self) -> str:
        return self.summary.arch

    @property
    def n_embd(self) -> int:
        return int(self.summary.n_embd)

    @property
    def block_count(self) -> int:
        """As stored ({arch}.block_count): MTP (nextn) blocks included."""
        return int(self.summary.n_layer)

    @property
    def n_layer(self) -> int:
        """The layers hidden states can be tapped from: block_count less the MTP blocks."""
        return int(self.summary.n_layer_main)

    @property
    def n_vocab(self) -> int:
        return int(self.summary.n_vocab)


def read_target(path: str | Path) -> Target:
    """What the conversion needs from the target: a GGUF file, or a Hugging Face model directory."""
    path = Path(path)
    if path.is_dir():
        if is_hf_model_dir(path):
            return _hf_target(path)
        raise ConversionError(f"target {str(path)!r} is a directory without config.json: pass a GGUF file or a "
                              f"Hugging Face model directory")
    try:
        file = open_gguf(path)
        s = summarise(file)
    except PyllamaspecError as e:
        raise ConversionError(f"target: {e}") from None
    if s.role in ("dflash", "dflash2", "dspark", "eagle3") or s.arch in ("dflash", "eagle3"):
        raise ConversionError(f"target {str(path)!r} is itself a drafter ({s.role}); pass the target model's GGUF")
    if s.n_embd is None or s.n_layer is None:
        raise ConversionError(f"target GGUF {str(path)!r} lacks {s.arch}.embedding_length / {s.arch}.block_count")
    n_tokens = file.array_lengths.get("tokenizer.ggml.tokens", 0)
    if s.vocab_fingerprint is None or n_tokens <= 0:
        raise ConversionError(
            f"target GGUF {str(path)!r} has no tokenizer (tokenizer.ggml.tokens); the drafter GGUF needs the "
            f"target's tokenizer")
    return Target(
        path=path,
        # the drafter GGUF carries the target's token list, so its vocabulary is that list
        summary=dataclasses.replace(s, n_vocab=n_tokens),
        name=s.name or path.stem,
        uses_mrope=f"{s.arch}.rope.dimension_sections" in s.metadata,
        fingerprint=target_fingerprint(s.vocab_fingerprint, s.n_embd, s.n_layer),
        # the drafter's own mask token replaces the target's
        tokenizer_kv=file.tokenizer_kv(leave_out=("tokenizer.ggml.mask_token_id",)),
    )


def _hf_target(path: Path) -> Target:
    t = read_hf_target(path)
    block_count = t.n_layer + t.n_layer_nextn  # what a GGUF of this target would store
    summary = GGUFSummary(
        path=str(path), size_bytes=0, arch=t.arch, name=t.name, n_vocab=len(t.tokens), n_embd=t.n_embd,
        n_layer=block_count, n_layer_nextn=t.n_layer_nextn, tokenizer_model="gpt2",
        role=role_of(t.arch, n_layer_nextn=t.n_layer_nextn), vocab_fingerprint=t.vocab_fingerprint)
    return Target(
        path=path,
        summary=summary,
        name=t.name,
        uses_mrope=t.uses_mrope,
        fingerprint=target_fingerprint(t.vocab_fingerprint, t.n_embd, block_count),
        tokenizer_kv=t.tokenizer_kv,
    )


def drafter_summary(spec: DrafterSpec) -> GGUFSummary:
    """What the drafter GGUF about to be written will declare, for the pairing verdict."""
    is_dflash2 = spec.version == 2
    metadata: dict[str, Any] = {"general.architecture": ARCH}
    if is_dflash2:
        metadata.update({f"{ARCH}.selector_top_k": spec.selector_top_k, f"{ARCH}.conv_group_size": spec.conv_group})
    return GGUFSummary(
        path=f"the {spec.hf_arch} checkpoint", size_bytes=0, arch=ARCH, n_vocab=spec.vocab, n_embd=spec.hidden,
        n_layer=spec.n_layers, mask_token_id=spec.mask_token_id, block_size=spec.block_size,
        # HF ids name the layer whose OUTPUT is tapped; llama.cpp taps the INPUT of layer id+1
        target_layers=tuple(i + 1 for i in spec.target_layer_ids), is_dflash2=is_dflash2,
        role=role_of(ARCH, is_dflash2=is_dflash2), metadata=metadata)


def check_pairing(spec: DrafterSpec, target: Target) -> None:
    """Refuse (PairingError, every problem on one line) a drafter that cannot run with the target: the
    verdict of ggufinfo.pairing on the GGUF about to be written, in the config's terms. The config's
    num_target_layers, which no GGUF carries, is checked here."""
    who = f"target {target.path.name!r} ({target.arch})"
    report = check_pair(target.summary, drafter_summary(spec), ["draft-dflash"])
    messages: list[str] = []
    for problem in report.problems:
        if problem.field == "n_embd":
            messages.append(f"hidden_size: drafter config has {spec.hidden}, {who} has n_embd {target.n_embd}")
        elif problem.field == "n_vocab":
            messages.append(f"vocab_size: drafter config has {spec.vocab}, {who} tokenizer has "
                            f"{target.n_vocab} tokens")
        elif problem.field == "mask_token_id":
            messages.append(f"dflash_config.mask_token_id {spec.mask_token_id} is outside the vocabulary: {who} "
                            f"has {target.n_vocab} tokens")
        elif problem.field == "target_layers":
            messages += _layer_id_messages(spec, target, who)
        else:
            messages.append(f"{who}: {problem}")
    if spec.num_target_layers is not None and spec.num_target_layers != target.n_layer:
        messages.append(f"num_target_layers: drafter was trained on a {spec.num_target_layers}-layer target, {who} "
                        f"has n_layer {target.n_layer}")
    if messages:
        raise PairingError("; ".join(messages))


def _layer_id_messages(spec: DrafterSpec, target: Target, who: str) -> list[str]:
    lowest, highest = tappable_layer_range(target.arch, target.n_layer)  # known: the arch hands over inputs
    final = highest == target.n_layer
    why = (f"valid ids are {lowest - 1}..{highest - 1} (n_layer {target.n_layer}; llama.cpp taps the input of "
           f"layer id+1" + (")" if final else f", and a {target.arch} graph records layer inputs below n_layer only)"))
    return [f"dflash_config.target_layer_ids[{i}] = {lid} is out of range for {who}: {why}"
            for i, lid in enumerate(spec.target_layer_ids) if not lowest <= lid + 1 <= highest]
