"""Decide whether a target and a drafter can run together: the single place for that decision.

It works on GGUF headers alone (summary.GGUFSummary), so the session API can refuse a bad pair before any
native allocation, and `inspect --pair` and the converter (which describes the drafter it is about to write
as a summary) give the same verdict. The rules mirror what the vendored llama.cpp checks or silently assumes
(common/speculative.cpp, src/models/dflash.cpp, src/models/eagle3.cpp, and native/session_open.cpp's validate_pair());
each problem names the field, both sides' values and what to do. tests/test_pairing_parity.py holds the
verdict to what a native session accepts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import DRAFTER_TYPES, MAX_DRAFT, SPEC_TYPES
from ..errors import ModelLoadError, PairingError
from .reader import token_fingerprint
from .summary import GGUFSummary

# Hidden-state drafters (DFlash, EAGLE3) read the INPUT of target layer L (GGUF id = HF id + 1). Target graphs
# record those inputs (res->t_layer_inp) only in these archs (upstream src/models/*.cpp at the pinned commit),
# and only for L < n_layer, except the few that also record the final one. Anything else trips a GGML_ASSERT.
# native/session_open.cpp guards the same rule for callers that skip this module.
LAYER_INPUT_ARCHS = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "gemma4", "muse-glimmer",
    "deepseek4", "nemotron_h", "nemotron_h_moe", "bailingmoe3", "hunyuan_vl", "gpt-oss", "lfm2", "lfm2moe",
    "minimax-01", "minimax-m2", "mimo2", "nanbeige"})
FINAL_LAYER_INPUT_ARCHS = frozenset({"deepseek4", "nemotron_h", "nemotron_h_moe", "mimo2"})

# common/speculative.cpp: a plain draft model may differ from the target by this many tokens, and
# token texts are compared from this id on (the first few are special tokens that may differ).
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5

DFLASH_DEFAULT_BLOCK_SIZE = 16  # upstream's block size when dflash.block_size is absent
DFLASH_MIN_BLOCK_SIZE = 2  # one anchor plus at least one masked position to draft
EAGLE3_N_TARGET_LAYERS = 3


@dataclass(frozen=True)
class PairingProblem:
    field: str
    target_value: object
    drafter_value: object
    message: str  # what is wrong and what to do

    def __str__(self) -> str:
        return (
            f"{self.field}: target has {_show(self.target_value)}, drafter has {_show(self.drafter_value)}"
            f" — {self.message}"
        )


@dataclass(frozen=True)
class PairingReport:
    ok: bool
    spec_types: tuple[str, ...]
    problems: tuple[PairingProblem, ...]
    notes: tuple[str, ...]


def detect_spec_types(drafter: GGUFSummary) -> tuple[str, ...]:
    """The speculative type a drafter GGUF implies, as upstream's common_speculative_types_from_gguf."""
    if drafter.arch == "dflash":
        return ("draft-dspark",) if drafter.is_dspark else ("draft-dflash",)
    if drafter.n_layer_nextn > 0:
        return ("draft-mtp",)
    if drafter.arch == "eagle3":
        return ("draft-eagle3",)
    return ("draft-simple",)


def check_pair(
    target: GGUFSummary,
    drafter: GGUFSummary | None,
    spec_types: Sequence[str] | None = None,
    n_max: int | None = None,
) -> PairingReport:
    """Judge target + drafter for ``spec_types`` (llama.cpp names).

    ``spec_types=None`` detects the type from the drafter as upstream does (nothing without a
    drafter); an empty sequence or ``["none"]`` means plain decoding. ``n_max``, when given, must be a
    draft length a session accepts, and is checked against what the drafter can produce per step.
    """
    checker = _PairChecker(target, drafter)
    checker.check_n_max(n_max)
    if spec_types is None:
        types = detect_spec_types(drafter) if drafter is not None else ()
    else:
        types = tuple(spec_types)
    checker.check_type_combination(types)
    for spec_type in types:
        if spec_type == "draft-simple":
            checker.check_draft_simple()
        elif spec_type == "draft-eagle3":
            checker.check_eagle3()
        elif spec_type in ("draft-dflash", "draft-dspark"):
            checker.check_dflash(spec_type, n_max)
        elif spec_type == "draft-mtp":
            checker.check_mtp()
    return PairingReport(
        ok=not checker.problems,
        spec_types=types,
        problems=tuple(checker.problems),
        notes=tuple(checker.notes),
    )


def require_pair(
    target: GGUFSummary,
    drafter: GGUFSummary | None,
    spec_types: Sequence[str] | None = None,
    n_max: int | None = None,
) -> PairingReport:
    """check_pair(), raising PairingError that lists every problem if the pair cannot run."""
    report = check_pair(target, drafter, spec_types, n_max)
    if not report.ok:
        subject = f"{drafter.path} cannot draft for {target.path}" if drafter else f"{target.path} cannot run"
        types = ", ".join(report.spec_types) or "none"
        lines = "\n".join(f"  - {problem}" for problem in report.problems)
        raise PairingError(f"{subject} ({types}):\n{lines}")
    return report


def tappable_layer_range(arch: str, n_layer: int, final_allowed: bool = False) -> tuple[int, int] | None:
    """The GGUF layer ids (HF id + 1) a hidden-state drafter may tap on a target of ``arch`` with ``n_layer``
    trunk layers (MTP blocks excluded), or None when the arch hands over no layer inputs at all. EAGLE3
    (``final_allowed``) may also tap id n_layer, the final hidden state, which upstream reads through the
    NextN embeddings instead."""
    if arch not in LAYER_INPUT_ARCHS:
        return None
    return 1, n_layer if final_allowed or arch in FINAL_LAYER_INPUT_ARCHS else n_layer - 1


def _show(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


class _PairChecker:
    """Collects the problems and notes of one target/drafter pair."""

    def __init__(self, target: GGUFSummary, drafter: GGUFSummary | None) -> None:
        self.target = target
        self.drafter = drafter
        self.problems: list[PairingProblem] = []
        self.notes: list[str] = []

    def problem(self, field: str, target_value: object, drafter_value: object, message: str) -> None:
        self.problems.append(PairingProblem(field, target_value, drafter_value, message))

    def roles_problem(self, message: str) -> None:
        """A problem with the choice of types rather than with a value: show what each file is."""
        drafter_role = f"role {self.drafter.role}" if self.drafter else "no drafter"
        self.problem("spec_types", f"role {self.target.role}", drafter_role, message)

    def drafter_is_target(self) -> bool:
        return self.drafter is not None and os.path.realpath(self.drafter.path) == os.path.realpath(self.target.path)

    def check_n_max(self, n_max: int | None) -> None:
        if n_max is not None and not (isinstance(n_max, int) and 0 <= n_max <= MAX_DRAFT):
            self.problem("n_max", f"a limit of {MAX_DRAFT}", n_max,
                         f"the draft length per step must be within 0..{MAX_DRAFT}")

    # -- which types, with or without a drafter ------------------------------------------------

    def check_type_combination(self, types: tuple[str, ...]) -> None:
        unknown = [t for t in types if t not in SPEC_TYPES]
        for name in unknown:
            self.roles_problem(f"unknown speculative type '{name}'; valid: {', '.join(SPEC_TYPES)}")
        if "none" in types and len(types) > 1:
            self.roles_problem("'none' (plain decoding) cannot be combined with other speculative types")
        drafter_types = [t for t in types if t in DRAFTER_TYPES]
        if len(drafter_types) > 1:
            self.roles_problem(
                f"{' and '.join(drafter_types)} each need the drafter to be of their own kind: pick one"
            )
        if self.drafter is None:
            for name in drafter_types:
                self.roles_problem(f"{name} needs a drafter GGUF: pass one, or use an n-gram type")
        elif not drafter_types and not ("draft-mtp" in types and self.drafter_is_target()) and not unknown:
            listed = ", ".join(types) or "none"
            self.roles_problem(
                f"the drafter is unused with {listed}: drop it, or add {detect_spec_types(self.drafter)[0]}"
            )

    # -- per type -------------------------------------------------------------------------------

    def check_draft_simple(self) -> None:
        drafter = self.drafter
        if drafter is None:
            return
        if drafter.arch in ("dflash", "eagle3"):
            self.roles_problem(
                f"draft-simple needs a plain language model as drafter; this one is {drafter.arch}: "
                f"use {detect_spec_types(drafter)[0]}"
            )
            return
        target = self.target
        if target.tokenizer_model != drafter.tokenizer_model:
            self.problem(
                "tokenizer_model", target.tokenizer_model, drafter.tokenizer_model,
                "the drafter must use the same tokenizer type: pick a drafter of the target's model family",
            )
        for kind in ("bos", "eos"):
            self.check_special_token(kind)
        if target.n_vocab is None or drafter.n_vocab is None:
            self.notes.append("draft-simple: a vocabulary size is unknown; tokens were not compared")
            return
        if abs(target.n_vocab - drafter.n_vocab) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
            self.problem(
                "n_vocab", target.n_vocab, drafter.n_vocab,
                f"a draft model's vocabulary may differ by at most {SPEC_VOCAB_MAX_SIZE_DIFFERENCE} tokens: "
                "pick a drafter of the target's model family",
            )
            return
        self.check_token_texts()

    def check_special_token(self, kind: str) -> None:
        """Upstream refuses a pair whose add_<kind> flags differ, or whose ids differ when both add it."""
        target, drafter = self.target, self.drafter
        assert drafter is not None
        key = f"tokenizer.ggml.add_{kind}_token"
        target_adds, drafter_adds = target.metadata.get(key), drafter.metadata.get(key)
        if target_adds is not None and drafter_adds is not None and target_adds != drafter_adds:
            self.problem(
                f"add_{kind}_token", target_adds, drafter_adds,
                f"both models must agree on adding {kind.upper()}: pick a drafter of the target's model family",
            )
        elif target_adds and drafter_adds:
            target_id, drafter_id = getattr(target, f"{kind}_token_id"), getattr(drafter, f"{kind}_token_id")
            if target_id != drafter_id:
                self.problem(
                    f"{kind}_token_id", target_id, drafter_id,
                    f"both models add {kind.upper()}, so it must be the same token: pick a drafter of the "
                    "target's model family",
                )

    def check_token_texts(self) -> None:
        """Compare the token lists where upstream does: ids from 5 up to the shorter vocabulary."""
        target, drafter = self.target, self.drafter
        assert drafter is not None and target.n_vocab is not None and drafter.n_vocab is not None
        if target.vocab_fingerprint is None or drafter.vocab_fingerprint is None:
            self.notes.append("draft-simple: a file has no token list; only vocabulary sizes were compared")
            return
        if target.vocab_fingerprint == drafter.vocab_fingerprint:
            return  # identical token lists
        shared = min(target.n_vocab, drafter.n_vocab)
        try:
            target_part = token_fingerprint(target.path, SPEC_VOCAB_CHECK_START_TOKEN_ID, shared)
            drafter_part = token_fingerprint(drafter.path, SPEC_VOCAB_CHECK_START_TOKEN_ID, shared)
        except ModelLoadError:
            target_part = drafter_part = None
        if target_part is None or drafter_part is None:
            self.notes.append("draft-simple: a file could not be re-read; only vocabulary sizes were compared")
            return
        if target_part != drafter_part:
            self.problem(
                "tokens", f"token list sha256 {target_part[:12]}…", f"{drafter_part[:12]}…",
                f"tokens {SPEC_VOCAB_CHECK_START_TOKEN_ID}..{shared - 1} differ: the drafter must share the "
                "target's tokenizer; pick a drafter of the same model family",
            )

    def check_eagle3(self) -> None:
        drafter = self.drafter
        if drafter is None:
            return
        if drafter.arch != "eagle3":
            self.roles_problem(f"draft-eagle3 needs an eagle3 GGUF; this drafter is {drafter.arch}: "
                               f"use {detect_spec_types(drafter)[0]}")
            return
        # EAGLE3 states the target hidden size it was trained on (its fc reads 3 target layers of that width),
        # and it embeds tokens with the target's embeddings, so its own width must be the target's as well
        # (native/session_open.cpp refuses any other width)
        target = self.target
        trained_for = drafter.target_hidden_size
        if trained_for is not None and trained_for != target.n_embd:
            self.problem(
                "n_embd", target.n_embd, trained_for,
                "the drafter was trained on another target's hidden states (eagle3.target_hidden_size): "
                "use the EAGLE3 drafter made for this target",
            )
        elif drafter.n_embd != target.n_embd:
            self.problem(
                "n_embd", target.n_embd, drafter.n_embd,
                "an EAGLE3 drafter's width must be its target's (it embeds tokens with the target's embeddings): "
                "use the EAGLE3 drafter made for this target",
            )
        if len(drafter.target_layers) != EAGLE3_N_TARGET_LAYERS:
            self.problem(
                "target_layers", self.target.n_layer_main, drafter.target_layers,
                f"EAGLE3 taps exactly {EAGLE3_N_TARGET_LAYERS} target layers: re-convert the drafter",
            )
        else:
            self.check_layer_ids(final_allowed=True)
        self.check_head_vocab()

    def check_dflash(self, spec_type: str, n_max: int | None) -> None:
        drafter = self.drafter
        if drafter is None:
            return
        if drafter.arch != "dflash":
            self.roles_problem(f"{spec_type} needs a dflash GGUF; this drafter is {drafter.arch}: "
                               f"use {detect_spec_types(drafter)[0]}")
            return
        if (spec_type == "draft-dspark") != drafter.is_dspark:
            self.roles_problem(f"{spec_type} does not fit this drafter: use {detect_spec_types(drafter)[0]}")
            return
        target = self.target
        if drafter.n_embd != target.n_embd:
            self.problem(
                "n_embd", target.n_embd, drafter.n_embd,
                "the drafter reads the target's hidden states, so the widths must match: "
                "use the DFlash drafter made for this target",
            )
        if not drafter.target_layers:
            self.problem("target_layers", target.n_layer_main, None,
                         "the drafter declares no dflash.target_layers: re-convert it")
        else:
            self.check_layer_ids()
        if drafter.mask_token_id is None:
            self.problem("mask_token_id", f"{target.n_vocab} tokens", None,
                         "the drafter has no tokenizer.ggml.mask_token_id: re-convert it")
        elif target.n_vocab is not None and not 0 <= drafter.mask_token_id < target.n_vocab:
            self.problem(
                "mask_token_id", f"{target.n_vocab} tokens", drafter.mask_token_id,
                "the mask token must be a token of the target's vocabulary: use the drafter made for this target",
            )
        self.check_head_vocab()
        block_size = self.check_block_size()
        if drafter.is_dflash2:
            self.check_dflash2()
        # DFlash denoises [anchor, mask * (block_size-1)] in place; anchor-first DSpark drafts a full block
        from_anchor = drafter.is_dspark and drafter.arch_value("sample_from_anchor") is True
        n_draft_max = block_size if from_anchor else block_size - 1
        if n_max is not None and n_max > n_draft_max:
            self.notes.append(
                f"{spec_type}: n_max {n_max} clamped to block size: at most {n_draft_max} draft tokens per step"
            )

    def check_mtp(self) -> None:
        if self.target.n_layer_nextn == 0:
            drafter_nextn = self.drafter.n_layer_nextn if self.drafter else None
            self.problem(
                "n_layer_nextn", 0, drafter_nextn,
                "draft-mtp drafts with the target's own MTP (nextn) layers and this target has none: "
                "use a GGUF converted with its MTP layers, or another speculative type",
            )

    # -- shared by the hidden-state drafters ------------------------------------------------------

    def check_layer_ids(self, final_allowed: bool = False) -> None:
        """Each tapped id must be a layer whose input the target can hand over (tappable_layer_range)."""
        target, drafter = self.target, self.drafter
        assert drafter is not None
        n_layer = target.n_layer_main
        if n_layer is None:
            self.notes.append("the target declares no block_count; tapped layer ids were not checked")
            return
        valid = tappable_layer_range(target.arch, n_layer, final_allowed)
        if valid is None:
            self.problem(
                "arch", target.arch, drafter.target_layers,
                f"a {target.arch} target does not hand over layer inputs, which this drafter reads: "
                "it cannot draft for this target",
            )
            return
        lowest, highest = valid
        bad = [i for i in drafter.target_layers if not lowest <= i <= highest]
        if bad:
            self.problem(
                "target_layers", f"{n_layer} layers ({target.arch})", drafter.target_layers,
                f"ids {_show(bad)} are outside {lowest}..{highest}, the layers a {target.arch} target of {n_layer} "
                "layers can hand over: the drafter was made for a different target",
            )

    def check_head_vocab(self) -> None:
        target, drafter = self.target, self.drafter
        assert drafter is not None
        if "d2t" in drafter.tensors:
            self.notes.append(f"the drafter drafts over a reduced vocabulary of {drafter.tensors['d2t'][0][0]} "
                              "tokens mapped to the target's (d2t)")
        elif drafter.n_vocab is None:
            self.notes.append(f"the drafter has no vocabulary of its own; it uses the target's ({target.n_vocab})")
        elif target.n_vocab is not None and drafter.n_vocab != target.n_vocab:
            self.problem(
                "n_vocab", target.n_vocab, drafter.n_vocab,
                "the drafter's output vocabulary must be the target's: use the drafter made for this target",
            )

    def check_block_size(self) -> int:
        """The block size the drafter will run with (upstream's default when absent)."""
        drafter = self.drafter
        assert drafter is not None
        if drafter.block_size is None:
            self.notes.append(
                f"the drafter declares no dflash.block_size; upstream assumes {DFLASH_DEFAULT_BLOCK_SIZE}"
            )
            return DFLASH_DEFAULT_BLOCK_SIZE
        if not DFLASH_MIN_BLOCK_SIZE <= drafter.block_size <= MAX_DRAFT:
            self.problem(
                "block_size", f"a limit of {MAX_DRAFT}", drafter.block_size,
                f"the block size must be within {DFLASH_MIN_BLOCK_SIZE}..{MAX_DRAFT}: re-convert the drafter",
            )
        return drafter.block_size

    def check_dflash2(self) -> None:
        """src/models/dflash.cpp refuses these DFlash2 shapes at load time."""
        drafter = self.drafter
        assert drafter is not None
        if drafter.n_embd is None:
            return  # already reported as an n_embd mismatch
        width = f"n_embd {drafter.n_embd}"
        top_k = drafter.arch_value("selector_top_k")
        group = drafter.arch_value("conv_group_size")
        if not top_k or not group or top_k <= 0 or group <= 0:
            self.problem(
                "selector_top_k/conv_group_size", width, (top_k, group),
                "the DFlash2 drafter lacks its selector/conv metadata: re-convert it",
            )
            return
        if drafter.n_embd < top_k * (top_k + 1):
            self.problem(
                "selector_top_k", width, top_k,
                f"DFlash2 needs n_embd >= top_k*(top_k+1) = {top_k * (top_k + 1)}: re-convert with a smaller top-k",
            )
        if drafter.n_embd % group:
            self.problem(
                "conv_group_size", width, group,
                "DFlash2 needs n_embd to be a multiple of conv_group_size: re-convert the drafter",
            )
