"""ggufinfo (the GGUF reader and header summaries), pairing (target + drafter rules) and the inspect command,
on tiny GGUFs written here with gguf.GGUFWriter."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from pyllamaspec.cli import inspect as inspect_cmd
from pyllamaspec.cli.app import run_command
from pyllamaspec.errors import ModelLoadError, PairingError
from pyllamaspec.ggufinfo import GGUFSummary, open_gguf, read_summary, token_fingerprint, tokenizer_kv
from pyllamaspec.ggufinfo import check_pair, detect_spec_types, require_pair

N_EMBD = 64
N_VOCAB = 300
TOKENS = [f"tok{i}" for i in range(N_VOCAB)]
MASK_ID = N_VOCAB - 1
Q8_0_BLOCK_BYTES = 34  # 32 weights: an f16 scale and 32 int8


def write_gguf(
    path: Path,
    arch: str,
    kv: dict[str, Any],
    tensors: dict[str, np.ndarray] | None = None,
    tokens: list[str] | None = None,
    q8_tensors: dict[str, int] | None = None,
) -> Path:
    """A GGUF with raw keys (int -> uint32, list of int -> int32 array), F32 tensors, Q8_0 tensors of
    ``rows`` x 32 weights, and a gpt2 tokenizer when ``tokens`` is given."""
    writer = gguf.GGUFWriter(str(path), arch)
    if tokens is not None:
        kv = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.bos_token_id": 1,
              "tokenizer.ggml.eos_token_id": 2, **kv}
        writer.add_token_list(tokens)
        writer.add_token_types([1] * len(tokens))
    for key, value in kv.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, array)
    for name, rows in (q8_tensors or {}).items():
        blocks = np.zeros((rows, Q8_0_BLOCK_BYTES), dtype=np.uint8)
        writer.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def f32(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float32)


def target_gguf(tmp_path: Path, name: str = "target.gguf", arch: str = "qwen3", n_layer: int = 4,
                tokens: list[str] = TOKENS, **extra_kv: Any) -> Path:
    kv = {
        f"{arch}.block_count": n_layer,
        f"{arch}.embedding_length": N_EMBD,
        f"{arch}.context_length": 4096,
        "general.name": "Tiny",
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q8_0),
        "tokenizer.ggml.add_bos_token": False,
        **extra_kv,
    }
    return write_gguf(tmp_path / name, arch, kv, {"token_embd.weight": f32(8, N_EMBD)}, tokens,
                      q8_tensors={"output.weight": 2})


def dflash_gguf(tmp_path: Path, name: str = "dflash.gguf", *, with_tokens: bool = True,
                tensors: dict[str, np.ndarray] | None = None, **kv_overrides: Any) -> Path:
    kv: dict[str, Any] = {
        "dflash.block_count": 1,
        "dflash.embedding_length": N_EMBD,
        "dflash.block_size": 16,
        "dflash.target_layers": [1, 2, 3],
        "dflash.attention.causal": False,
        "dflash.attention.sliding_window": 2048,
        "dflash.attention.sliding_window_pattern": [True],
        "tokenizer.ggml.mask_token_id": MASK_ID,
    }
    kv.update(kv_overrides)
    kv = {k: v for k, v in kv.items() if v is not None}
    all_tensors = {"fc.weight": f32(N_EMBD, 3 * N_EMBD), **(tensors or {})}
    return write_gguf(tmp_path / name, "dflash", kv, all_tensors, TOKENS if with_tokens else None)


def eagle3_gguf(tmp_path: Path, target_layers: list[int], hidden: int = N_EMBD, width: int | None = None,
                name: str = "eagle3.gguf") -> Path:
    """An EAGLE3 drafter trained on a target of ``hidden`` (target_hidden_size), ``width`` wide itself
    (embedding_length; default: the same)."""
    width = hidden if width is None else width
    kv = {"eagle3.block_count": 1, "eagle3.embedding_length": width, "eagle3.target_hidden_size": hidden,
          "eagle3.target_layers": target_layers}
    return write_gguf(tmp_path / name, "eagle3", kv, {"fc.weight": f32(width, 3 * hidden)})


def serialised(tokens: list[str]) -> bytes:
    return b"".join(struct.pack("<Q", len(t.encode())) + t.encode() for t in tokens)


# -- ggufinfo ---------------------------------------------------------------------------------------


def test_summary_of_a_plain_target(tmp_path: Path) -> None:
    path = target_gguf(tmp_path)

    s = read_summary(path)

    assert (s.arch, s.name, s.role) == ("qwen3", "Tiny", "target")
    assert (s.n_vocab, s.n_embd, s.n_layer, s.n_ctx_train) == (N_VOCAB, N_EMBD, 4, 4096)
    assert s.file_type == "Q8_0"
    assert s.tensor_types == {"F32": 1, "Q8_0": 1}
    assert s.tensors["token_embd.weight"] == ((N_EMBD, 8), "F32")  # GGUF ne order: fastest dimension first
    assert s.tensors["output.weight"] == ((32, 2), "Q8_0")
    assert (s.tokenizer_model, s.tokenizer_pre, s.bos_token_id, s.eos_token_id) == ("gpt2", "qwen2", 1, 2)
    assert s.has_output_head and s.has_token_embd
    assert not s.is_hybrid and s.n_layer_nextn == 0
    assert s.size_bytes == path.stat().st_size
    assert s.vocab_fingerprint == hashlib.sha256(serialised(TOKENS)).hexdigest()
    assert s.metadata["general.architecture"] == "qwen3"
    assert "tokenizer.ggml.tokens" not in s.metadata and "tokenizer.ggml.token_type" not in s.metadata


def test_token_fingerprint_covers_the_requested_token_span(tmp_path: Path) -> None:
    path = target_gguf(tmp_path)

    assert token_fingerprint(path, 5, 20) == hashlib.sha256(serialised(TOKENS[5:20])).hexdigest()
    assert token_fingerprint(path, 5, 10_000) == hashlib.sha256(serialised(TOKENS[5:])).hexdigest()


def test_vocab_size_key_takes_precedence_over_the_token_count(tmp_path: Path) -> None:
    path = target_gguf(tmp_path, **{"qwen3.vocab_size": 320})

    assert read_summary(path).n_vocab == 320


def test_summary_of_a_dflash_drafter(tmp_path: Path) -> None:
    s = read_summary(dflash_gguf(tmp_path))

    assert (s.arch, s.role, s.is_dflash2, s.is_dspark) == ("dflash", "dflash", False, False)
    assert s.block_size == 16
    assert s.target_layers == (1, 2, 3)
    assert s.mask_token_id == MASK_ID
    assert (s.swa_window, s.swa_pattern, s.causal) == (2048, (True,), False)
    assert not s.has_output_head


def test_dflash2_dspark_eagle3_and_mtp_roles(tmp_path: Path) -> None:
    dflash2 = dflash_gguf(tmp_path, "d2.gguf", tensors={"selector_hidden.weight": f32(8, N_EMBD)})
    dspark = dflash_gguf(tmp_path, "ds.gguf", tensors={"markov_w1.weight": f32(N_VOCAB, 8)})
    eagle3 = eagle3_gguf(tmp_path, [1, 2, 3])
    mtp = write_gguf(tmp_path / "mtp.gguf", "glm4moe", {"glm4moe.block_count": 3},
                     {"blk.2.nextn.eh_proj.weight": f32(N_EMBD, 2 * N_EMBD)})

    assert read_summary(dflash2).role == "dflash2" and read_summary(dflash2).is_dflash2
    assert read_summary(dspark).role == "dspark" and read_summary(dspark).is_dspark
    assert read_summary(eagle3).role == "eagle3"
    assert read_summary(eagle3).target_hidden_size == N_EMBD
    mtp_summary = read_summary(mtp)
    assert (mtp_summary.role, mtp_summary.n_layer_nextn, mtp_summary.n_layer_main) == ("mtp-target", 1, 2)


def test_hybrid_arch_is_recognised(tmp_path: Path) -> None:
    assert read_summary(target_gguf(tmp_path, arch="qwen35", n_layer=8)).is_hybrid
    # an arch upstream does not list, but which declares recurrent layers
    assert read_summary(target_gguf(tmp_path, "x.gguf", arch="newhybrid", **{"newhybrid.ssm.state_size": 16})).is_hybrid


def test_tensor_type_newer_than_the_gguf_package_is_reported_not_refused(tmp_path: Path) -> None:
    path = target_gguf(tmp_path)
    data = bytearray(path.read_bytes())
    # the tensor info of output.weight: name, n_dims (u32), 2 dims (u64), type (u32), offset (u64)
    name = b"output.weight"
    type_at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4 + 2 * 8
    assert struct.unpack_from("<I", data, type_at)[0] == gguf.GGMLQuantizationType.Q8_0
    struct.pack_into("<I", data, type_at, 42)  # Q2_0 in the vendored ggml, unknown to gguf 0.19
    path.write_bytes(bytes(data))

    assert read_summary(path).tensors["output.weight"][1] in ("TYPE_42", "Q2_0")


def test_missing_file_is_a_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such file"):
        read_summary(tmp_path / "absent.gguf")


def test_directory_is_a_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="is a directory"):
        read_summary(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"GG", "truncated"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 100, "not a GGUF file"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n", "Git LFS pointer"),
        (struct.pack("<Q", 2) + b"{}" + b"\0" * 16, "safetensors"),
    ],
    ids=["empty", "short", "garbage", "lfs-pointer", "safetensors"],
)
def test_files_that_are_not_gguf_are_model_load_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)

    with pytest.raises(ModelLoadError, match=message):
        read_summary(path)


def test_file_cut_inside_its_tensor_data_is_a_model_load_error(tmp_path: Path) -> None:
    path = target_gguf(tmp_path)
    full = path.read_bytes()
    # the last tensor (output.weight) holds 68 bytes, then the writer pads to 32: cut past the padding
    path.write_bytes(full[:-60])

    with pytest.raises(ModelLoadError, match=rf"truncated: it has {len(full) - 60} bytes but its tensors need"):
        read_summary(path)


def test_file_cut_inside_its_header_is_a_model_load_error(tmp_path: Path) -> None:
    path = target_gguf(tmp_path)
    path.write_bytes(path.read_bytes()[:200])

    with pytest.raises(ModelLoadError, match="truncated inside its header"):
        read_summary(path)


def test_unsupported_gguf_version_is_a_model_load_error(tmp_path: Path) -> None:
    path = target_gguf(tmp_path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 4, 9)
    path.write_bytes(bytes(data))

    with pytest.raises(ModelLoadError, match="GGUF version 9 is not supported"):
        read_summary(path)


# -- pairing ----------------------------------------------------------------------------------------


@pytest.fixture
def target(tmp_path: Path) -> GGUFSummary:
    return read_summary(target_gguf(tmp_path))


def problem_fields(report: Any) -> list[str]:
    return [p.field for p in report.problems]


def test_detect_spec_types_follows_upstream(tmp_path: Path, target: GGUFSummary) -> None:
    mtp = write_gguf(tmp_path / "mtp.gguf", "glm4moe", {"glm4moe.block_count": 3},
                     {"blk.2.nextn.eh_proj.weight": f32(4, 4)})
    assert detect_spec_types(read_summary(dflash_gguf(tmp_path))) == ("draft-dflash",)
    assert detect_spec_types(read_summary(dflash_gguf(tmp_path, "ds.gguf",
                                                      tensors={"markov_w1.weight": f32(4, 4)}))) == ("draft-dspark",)
    assert detect_spec_types(read_summary(mtp)) == ("draft-mtp",)
    assert detect_spec_types(read_summary(eagle3_gguf(tmp_path, [1, 2, 3]))) == ("draft-eagle3",)
    assert detect_spec_types(target) == ("draft-simple",)


def test_matching_dflash_pair_passes(tmp_path: Path, target: GGUFSummary) -> None:
    report = require_pair(target, read_summary(dflash_gguf(tmp_path)))

    assert report.ok and report.problems == ()
    assert report.spec_types == ("draft-dflash",)


def test_dflash_hidden_size_mismatch_names_both_values(tmp_path: Path, target: GGUFSummary) -> None:
    drafter = read_summary(dflash_gguf(tmp_path, **{"dflash.embedding_length": 32}))

    report = check_pair(target, drafter)

    (problem,) = report.problems
    assert (problem.field, problem.target_value, problem.drafter_value) == ("n_embd", N_EMBD, 32)
    assert str(problem).startswith(f"n_embd: target has {N_EMBD}, drafter has 32 — ")


def test_dflash_layer_ids_must_be_layers_the_target_has(tmp_path: Path, target: GGUFSummary) -> None:
    drafter = read_summary(dflash_gguf(tmp_path, **{"dflash.target_layers": [0, 2, 5]}))

    (problem,) = check_pair(target, drafter).problems

    assert problem.field == "target_layers"
    assert problem.drafter_value == (0, 2, 5)
    assert "ids [0, 5] are outside 1..3" in problem.message


def test_only_some_targets_hand_over_their_last_layer(tmp_path: Path) -> None:
    drafter = read_summary(dflash_gguf(tmp_path, **{"dflash.target_layers": [2, 8]}))
    hybrid = read_summary(target_gguf(tmp_path, "hybrid.gguf", arch="qwen35", n_layer=8))
    dense = read_summary(target_gguf(tmp_path, "dense.gguf", arch="qwen3", n_layer=8))
    final = read_summary(target_gguf(tmp_path, "final.gguf", arch="nemotron_h", n_layer=8))

    assert problem_fields(check_pair(hybrid, drafter)) == ["target_layers"]
    assert "outside 1..7" in check_pair(hybrid, drafter).problems[0].message
    assert problem_fields(check_pair(dense, drafter)) == ["target_layers"]
    assert check_pair(final, drafter).ok


def test_target_without_layer_inputs_cannot_host_a_dflash_drafter(tmp_path: Path) -> None:
    drafter = read_summary(dflash_gguf(tmp_path, **{"dflash.target_layers": [2]}))
    qwen2 = read_summary(target_gguf(tmp_path, "qwen2.gguf", arch="qwen2", n_layer=8))
    assert problem_fields(check_pair(qwen2, drafter)) == ["arch"]


def test_layer_ids_exclude_the_targets_mtp_blocks(tmp_path: Path) -> None:
    # 5 blocks of which 1 is an MTP block: 4 taps-able layers
    mtp_target = read_summary(target_gguf(tmp_path, "mtp.gguf", n_layer=5, **{"qwen3.nextn_predict_layers": 1}))
    drafter = read_summary(dflash_gguf(tmp_path, **{"dflash.target_layers": [2, 5]}))

    assert problem_fields(check_pair(mtp_target, drafter)) == ["target_layers"]


def test_dflash_mask_token_must_exist_in_the_target_vocab(tmp_path: Path, target: GGUFSummary) -> None:
    missing = read_summary(dflash_gguf(tmp_path, "a.gguf", **{"tokenizer.ggml.mask_token_id": None}))
    too_big = read_summary(dflash_gguf(tmp_path, "b.gguf", **{"tokenizer.ggml.mask_token_id": N_VOCAB}))

    assert problem_fields(check_pair(target, missing)) == ["mask_token_id"]
    (problem,) = check_pair(target, too_big).problems
    assert (problem.field, problem.drafter_value) == ("mask_token_id", N_VOCAB)
    assert str(N_VOCAB) in str(problem.target_value)


def test_dflash_vocab_must_match_unless_reduced_or_borrowed(tmp_path: Path, target: GGUFSummary) -> None:
    other_vocab = read_summary(dflash_gguf(tmp_path, "a.gguf", **{"dflash.vocab_size": 500}))
    reduced = read_summary(dflash_gguf(tmp_path, "b.gguf", tensors={"d2t": np.zeros(100, dtype=np.int32)},
                                       **{"dflash.vocab_size": 100}))
    borrowed = read_summary(dflash_gguf(tmp_path, "c.gguf", with_tokens=False))

    (problem,) = check_pair(target, other_vocab).problems
    assert (problem.field, problem.target_value, problem.drafter_value) == ("n_vocab", N_VOCAB, 500)
    reduced_report = check_pair(target, reduced)
    assert reduced_report.ok and any("reduced vocabulary of 100" in n for n in reduced_report.notes)
    borrowed_report = check_pair(target, borrowed)
    assert borrowed_report.ok and any("uses the target's" in n for n in borrowed_report.notes)


@pytest.mark.parametrize("block_size", [1, 65])
def test_dflash_block_size_out_of_range(tmp_path: Path, target: GGUFSummary, block_size: int) -> None:
    drafter = read_summary(dflash_gguf(tmp_path, **{"dflash.block_size": block_size}))

    (problem,) = check_pair(target, drafter).problems

    assert (problem.field, problem.drafter_value) == ("block_size", block_size)


def test_n_max_beyond_the_block_is_clamped_in_a_note(tmp_path: Path, target: GGUFSummary) -> None:
    drafter = read_summary(dflash_gguf(tmp_path))

    within = check_pair(target, drafter, n_max=15)
    beyond = check_pair(target, drafter, n_max=20)

    assert not any("clamped" in n for n in within.notes)
    assert beyond.ok
    assert any("clamped to block size" in n and "15 draft tokens" in n for n in beyond.notes)


def test_dflash2_selector_and_conv_shapes(tmp_path: Path, target: GGUFSummary) -> None:
    selector = {"selector_hidden.weight": f32(8, N_EMBD)}
    good = read_summary(dflash_gguf(tmp_path, "a.gguf", tensors=selector,
                                    **{"dflash.selector_top_k": 7, "dflash.conv_group_size": 16}))
    bad = read_summary(dflash_gguf(tmp_path, "b.gguf", tensors=selector,
                                   **{"dflash.selector_top_k": 8, "dflash.conv_group_size": 24}))
    unset = read_summary(dflash_gguf(tmp_path, "c.gguf", tensors=selector))

    assert check_pair(target, good).ok  # 64 >= 7*8 and 64 % 16 == 0
    assert problem_fields(check_pair(target, bad)) == ["selector_top_k", "conv_group_size"]  # 64 < 8*9, 64 % 24
    assert problem_fields(check_pair(target, unset)) == ["selector_top_k/conv_group_size"]


def test_eagle3_needs_three_layers_and_the_targets_hidden_size(tmp_path: Path, target: GGUFSummary) -> None:
    assert check_pair(target, read_summary(eagle3_gguf(tmp_path, [1, 2, 4]))).ok
    assert problem_fields(check_pair(target, read_summary(eagle3_gguf(tmp_path, [1, 2])))) == ["target_layers"]
    (problem,) = check_pair(target, read_summary(eagle3_gguf(tmp_path, [1, 2, 3], hidden=128))).problems
    assert (problem.field, problem.target_value, problem.drafter_value) == ("n_embd", N_EMBD, 128)


def test_draft_simple_pair_with_the_same_vocab_passes(tmp_path: Path, target: GGUFSummary) -> None:
    drafter = read_summary(target_gguf(tmp_path, "small.gguf"))

    report = check_pair(target, drafter)

    assert report.ok and report.spec_types == ("draft-simple",)


def test_draft_simple_tolerates_what_upstream_tolerates(tmp_path: Path, target: GGUFSummary) -> None:
    # a few more tokens, and a different special token below id 5: upstream compares ids 5.. only
    tokens = ["<other>"] + TOKENS[1:] + [f"extra{i}" for i in range(100)]
    drafter = read_summary(target_gguf(tmp_path, "small.gguf", tokens=tokens))

    assert check_pair(target, drafter).ok


def test_draft_simple_refuses_a_different_vocabulary(tmp_path: Path, target: GGUFSummary) -> None:
    changed = TOKENS.copy()
    changed[100] = "different"
    renamed = read_summary(target_gguf(tmp_path, "a.gguf", tokens=changed))
    too_big = read_summary(target_gguf(tmp_path, "b.gguf", tokens=TOKENS + [f"x{i}" for i in range(129)]))

    (problem,) = check_pair(target, renamed).problems
    assert problem.field == "tokens" and f"tokens 5..{N_VOCAB - 1} differ" in problem.message
    (problem,) = check_pair(target, too_big).problems
    assert (problem.field, problem.target_value, problem.drafter_value) == ("n_vocab", N_VOCAB, N_VOCAB + 129)


def test_draft_simple_refuses_another_tokenizer_type_or_bos_policy(tmp_path: Path, target: GGUFSummary) -> None:
    spm = read_summary(target_gguf(tmp_path, "a.gguf", **{"tokenizer.ggml.model": "llama"}))
    adds_bos = read_summary(target_gguf(tmp_path, "b.gguf", **{"tokenizer.ggml.add_bos_token": True}))

    (problem,) = check_pair(target, spm).problems
    assert (problem.field, problem.target_value, problem.drafter_value) == ("tokenizer_model", "gpt2", "llama")
    (problem,) = check_pair(target, adds_bos).problems
    assert (problem.field, problem.target_value, problem.drafter_value) == ("add_bos_token", False, True)


def test_draft_mtp_needs_a_target_with_mtp_layers(tmp_path: Path, target: GGUFSummary) -> None:
    mtp_path = target_gguf(tmp_path, "mtp.gguf", n_layer=5, **{"qwen3.nextn_predict_layers": 1})
    mtp_target = read_summary(mtp_path)

    assert problem_fields(check_pair(target, None, ["draft-mtp"])) == ["n_layer_nextn"]
    assert check_pair(mtp_target, None, ["draft-mtp"]).ok
    assert check_pair(mtp_target, read_summary(mtp_path)).ok  # the target passed as its own drafter
    unused = check_pair(mtp_target, read_summary(dflash_gguf(tmp_path)), ["draft-mtp"])
    assert problem_fields(unused) == ["spec_types"] and "drafter is unused" in unused.problems[0].message


def test_ngram_types_take_no_drafter(tmp_path: Path, target: GGUFSummary) -> None:
    drafter = read_summary(target_gguf(tmp_path, "small.gguf"))

    assert check_pair(target, None, ["ngram-mod", "ngram-simple"]).ok
    (problem,) = check_pair(target, drafter, ["ngram-mod"]).problems
    assert problem.field == "spec_types" and "drafter is unused with ngram-mod" in problem.message


def test_spec_type_that_needs_a_drafter_without_one(target: GGUFSummary) -> None:
    (problem,) = check_pair(target, None, ["draft-dflash"]).problems

    assert "draft-dflash needs a drafter GGUF" in problem.message


def test_spec_type_that_does_not_fit_the_drafter(tmp_path: Path, target: GGUFSummary) -> None:
    (problem,) = check_pair(target, read_summary(dflash_gguf(tmp_path)), ["draft-simple"]).problems

    assert problem.field == "spec_types" and "use draft-dflash" in problem.message


def test_unknown_spec_type_lists_the_valid_names(target: GGUFSummary) -> None:
    (problem,) = check_pair(target, None, ["draft-bogus"]).problems

    assert "unknown speculative type 'draft-bogus'" in problem.message
    for name in ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
                 "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"):
        assert name in problem.message


def test_require_pair_raises_listing_every_problem(tmp_path: Path, target: GGUFSummary) -> None:
    drafter = read_summary(dflash_gguf(tmp_path, **{"dflash.embedding_length": 32, "dflash.block_size": 100}))

    with pytest.raises(PairingError) as raised:
        require_pair(target, drafter)

    message = str(raised.value)
    assert f"n_embd: target has {N_EMBD}, drafter has 32 — " in message
    assert "block_size: target has a limit of 64, drafter has 100 — " in message


# -- inspect command --------------------------------------------------------------------------------


def run_inspect(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="pyllamaspec")
    inspect_cmd.register(parser.add_subparsers(dest="command"))
    return run_command(parser.parse_args(["inspect", *argv]))


def test_inspect_prints_an_aligned_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = dflash_gguf(tmp_path)

    assert run_inspect(str(path)) == 0

    lines = capsys.readouterr().out.splitlines()
    rows = {line.split("  ", 1)[0].strip(): line for line in lines}
    assert {"arch", "role", "quant", "size", "context", "n_embd", "n_layer", "n_vocab", "tokenizer",
            "block size", "target layers", "SWA window"} <= rows.keys()
    assert rows["target layers"].endswith("1, 2, 3")
    assert rows["size"].endswith("MiB")
    assert len({line.index(line.split()[-1]) for line in lines if line.startswith(("arch", "role"))}) == 1


def test_inspect_json_is_one_object_without_the_tensor_table(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert run_inspect(str(target_gguf(tmp_path)), "--json") == 0

    data = json.loads(capsys.readouterr().out)
    assert data["arch"] == "qwen3" and data["n_vocab"] == N_VOCAB and data["file_type"] == "Q8_0"
    assert "tensors" not in data and data["tensor_types"] == {"F32": 1, "Q8_0": 1}


def test_inspect_pair_exit_status_says_whether_the_pair_runs(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    target_path = str(target_gguf(tmp_path))
    good = str(dflash_gguf(tmp_path, "good.gguf"))
    bad = str(dflash_gguf(tmp_path, "bad.gguf", **{"dflash.embedding_length": 32}))

    assert run_inspect(target_path, "--pair", good) == 0
    assert capsys.readouterr().out.startswith("OK:")
    assert run_inspect(target_path, "--pair", bad, "--json") == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["ok"] is False and report["problems"][0]["field"] == "n_embd"
    assert captured.err.startswith("pyllamaspec: error: ") and "cannot draft for" in captured.err
    assert run_inspect(target_path, "--pair", good, "--spec-type", "ngram-mod") == 2
    assert "drafter is unused" in capsys.readouterr().out


def test_inspect_reports_errors_on_stderr_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "junk.gguf").write_bytes(b"not a model at all")

    assert run_inspect(str(tmp_path / "junk.gguf")) == 2

    captured = capsys.readouterr()
    assert captured.err.startswith("pyllamaspec: error: ") and "not a GGUF file" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


# -- the one reader: gguf.GGUFReader underneath ------------------------------------------------------


def test_long_arrays_read_as_gguf_reader_reads_them(tmp_path: Path) -> None:
    # longer than the reader keeps decoded: tokens, types and scores stay spans until asked for
    tokens = [f"t{i}\u00e9" for i in range(5000)]
    path = write_gguf(tmp_path / "big.gguf", "qwen3", {"qwen3.block_count": 2, "qwen3.embedding_length": N_EMBD,
                                                      "qwen3.target_layers": list(range(5000))},
                      {"token_embd.weight": f32(8, N_EMBD)}, tokens)
    reference = gguf.GGUFReader(path)
    ours = open_gguf(path)

    for key, field in reference.fields.items():
        if key.startswith("GGUF."):
            continue
        is_array = field.types[0] == gguf.GGUFValueType.ARRAY
        assert (ours.array(key) if is_array else ours.values[key]) == field.contents(), key
    assert ours.array_lengths["tokenizer.ggml.tokens"] == 5000
    assert "tokenizer.ggml.tokens" not in ours.values  # not decoded until asked for
    assert ours.token_fingerprint() == hashlib.sha256(serialised(tokens)).hexdigest()
    assert ours.token_fingerprint(5, 4000) == hashlib.sha256(serialised(tokens[5:4000])).hexdigest()
    assert read_summary(path).n_vocab == 5000
    assert [t.name for t in ours.tensor_views()] == [t.name for t in reference.tensors]


def test_tokenizer_kv_copies_exactly(tmp_path: Path) -> None:
    source = target_gguf(tmp_path, tokens=TOKENS + ["\u00fcber"], **{"tokenizer.ggml.mask_token_id": 5})
    kv = tokenizer_kv(source, leave_out=("tokenizer.ggml.mask_token_id",))
    writer = gguf.GGUFWriter(str(tmp_path / "copy.gguf"), "qwen3")
    for key, value, vtype, sub in kv:
        writer.add_key_value(key, value, vtype, sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    copy = read_summary(tmp_path / "copy.gguf")
    original = read_summary(source)
    assert copy.vocab_fingerprint == original.vocab_fingerprint
    assert (copy.tokenizer_model, copy.bos_token_id, copy.mask_token_id) == ("gpt2", 1, None)
    assert "tokenizer.ggml.mask_token_id" not in {key for key, *_ in kv}


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    # in a child, so that a reader that opened the FIFO would hang there, not here
    code = ("from pyllamaspec.ggufinfo import read_summary\n"
            "from pyllamaspec.errors import ModelLoadError\n"
            f"try:\n    read_summary({str(fifo)!r})\nexcept ModelLoadError as e:\n    print(e)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "is a FIFO, not a regular file" in p.stdout


def test_inspect_refuses_a_tensor_type_the_gguf_package_does_not_know(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = target_gguf(tmp_path)
    data = bytearray(path.read_bytes())
    name = b"output.weight"
    type_at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4 + 2 * 8
    struct.pack_into("<I", data, type_at, 250)
    path.write_bytes(bytes(data))

    assert read_summary(path).unknown_tensor_types == {"output.weight": "TYPE_250"}
    assert run_inspect(str(path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyllamaspec: error: ") and "output.weight (TYPE_250)" in err and "pip install -U gguf" in err
    with pytest.raises(ModelLoadError, match="output.weight"):
        open_gguf(path).tensor_views()


def test_corrupt_value_type_is_named(tmp_path: Path) -> None:
    path = target_gguf(tmp_path)
    data = bytearray(path.read_bytes())
    key = b"general.name"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    struct.pack_into("<I", data, at, 99)
    path.write_bytes(bytes(data))

    with pytest.raises(ModelLoadError, match="corrupt GGUF header .*unknown value type 99"):
        read_summary(path)


# -- one pairing verdict ----------------------------------------------------------------------------


def test_eagle3_must_be_as_wide_as_its_target(tmp_path: Path, target: GGUFSummary) -> None:
    wider = read_summary(eagle3_gguf(tmp_path, [1, 2, 3], width=2 * N_EMBD, name="wide.gguf"))

    (problem,) = check_pair(target, wider).problems

    assert (problem.field, problem.target_value, problem.drafter_value) == ("n_embd", N_EMBD, 2 * N_EMBD)
    assert "width" in problem.message


@pytest.mark.parametrize("n_max", [-5, 65])
def test_n_max_outside_what_a_session_takes_is_refused(tmp_path: Path, target: GGUFSummary, n_max: int,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    drafter_path = dflash_gguf(tmp_path)

    (problem,) = check_pair(target, read_summary(drafter_path), n_max=n_max).problems
    assert (problem.field, problem.drafter_value) == ("n_max", n_max)
    assert run_inspect(target.path, "--pair", str(drafter_path), "--n-max", str(n_max)) == 2
    out = capsys.readouterr().out
    assert out.startswith("NOT OK") and "n_max" in out and "0..64" in out


# -- metadata of the wrong type, corrupt sizes --------------------------------------------------------------


@pytest.mark.parametrize("key, value, found, expected", [
    ("qwen3.block_count", "28", "STRING", "an integer"),
    ("general.name", 5, "UINT32", "a string"),
    ("qwen3.context_length", [1, 2], "ARRAY of INT32", "an integer"),
])
def test_a_key_of_the_wrong_type_names_key_found_and_expected(tmp_path: Path, capsys, key, value, found,
                                                              expected) -> None:
    path = target_gguf(tmp_path, **{key: value})
    data = path.read_bytes()

    with pytest.raises(ModelLoadError, match=rf"metadata key '{key}' is {found}.*expected {expected}") as e:
        read_summary(path)
    assert "TypeError" not in str(e.value)
    assert run_inspect(str(path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyllamaspec: error: ") and key in err and "internal error" not in err
    assert path.read_bytes() == data  # read only
    assert read_summary(target_gguf(tmp_path, name="fine.gguf")).n_layer == 4  # and the process goes on


def test_target_layers_as_a_scalar_is_a_typed_error(tmp_path: Path) -> None:
    path = dflash_gguf(tmp_path, **{"dflash.target_layers": 3})
    with pytest.raises(ModelLoadError, match=r"'dflash.target_layers' is UINT32 \(3\), expected an ARRAY of "
                                             r"integers"):
        read_summary(path)


def test_a_corrupt_length_is_not_called_truncated(tmp_path: Path) -> None:
    path = target_gguf(tmp_path)
    data = bytearray(path.read_bytes())
    key = b"general.name"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4  # the string value's length
    struct.pack_into("<Q", data, at, 2 ** 50)
    path.write_bytes(bytes(data))

    with pytest.raises(ModelLoadError) as e:
        read_summary(path)
    assert "corrupt GGUF header" in str(e.value) and "truncated" not in str(e.value)
    assert "download was interrupted" not in str(e.value) and "damage" in str(e.value)


def test_a_corrupt_tensor_count_or_offset_is_not_called_truncated(tmp_path: Path) -> None:
    path = target_gguf(tmp_path)
    good = path.read_bytes()
    data = bytearray(good)
    struct.pack_into("<Q", data, 8, 2 ** 40)  # the tensor count
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="corrupt GGUF header.*claims 1099511627776 tensors") as e:
        read_summary(path)
    assert "truncated" not in str(e.value)

    data = bytearray(good)
    name = b"output.weight"
    offset_at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4 + 2 * 8 + 4
    struct.pack_into("<Q", data, offset_at, 2 ** 50 + 32)
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as e:
        read_summary(path)
    assert "truncated" not in str(e.value) and "corrupt" in str(e.value)

    # a file that is merely cut short is still called truncated
    path.write_bytes(good[: len(good) - 40])
    with pytest.raises(ModelLoadError, match="truncated"):
        read_summary(path)
