"""Helpers the test modules share (test modules import this module, never each other): the reference plain run,
the near-tie rule for comparing a speculative run with it, the stats invariants, synthetic DFlash drafters and a
chat template of Qwen3's shape."""

from __future__ import annotations

import pytest

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.tools.convert import convert_dflash

from ckptfactory import write_dflash_checkpoint

N_PREDICT = 48


def _on_gpu() -> bool:
    """The package was built with a GPU backend (the tests' models then go to the GPU)."""
    from pyllamaspec import _native

    return any(b in ("cuda", "hip", "vulkan", "metal") for b in _native.build_info().get("backends", []))


ON_GPU = _on_gpu()


def _near_tie() -> float:
    """Logit units. CPU kernels differ by batch shape at ~1e-5 relative; GPU kernels (tensor-core tiles, split-K
    reductions chosen per batch size) moved the tiny models' margins by up to ~5e-3 on an H200."""
    return 1e-2 if ON_GPU else 1e-3


NEAR_TIE = _near_tie()
PROMPT = [1, 5, 9, 2, 7, 3, 8, 1, 5, 9, 2, 7]
STREAM_PROMPTS = [PROMPT, [4, 4, 8, 15, 16, 23, 42], [7, 3, 3, 7, 1, 2]]  # three streams decoded together


def plain(target: Model, n_predict: int = N_PREDICT, prompt=PROMPT, **cfg):
    with SpecSession(target, None, SessionConfig(adaptive=False, spec_types=[], margins=True, n_ctx=512, **cfg)) as s:
        return s.generate(prompt, n_predict)


def assert_equal_up_to_near_tie(spec_tokens, ref):
    """Identical, or the first divergence sits where the plain run's top-2 margin is a near-tie."""
    for i, (a, b) in enumerate(zip(spec_tokens, ref.tokens)):
        if a != b:
            assert ref.margins[i] < NEAR_TIE, (
                f"divergence at {i} where the target's margin is {ref.margins[i]:.4g} (not a near-tie)")
            return
    assert len(spec_tokens) == len(ref.tokens)


def assert_stats_consistent(st):
    assert 0 <= st.n_accepted <= st.n_drafted
    assert sum(st.accepted_per_position) == st.n_accepted
    assert sum(st.drafted_per_position) == st.n_drafted
    assert all(a <= d for a, d in zip(st.accepted_per_position, st.drafted_per_position))
    # a position can only be accepted when every earlier one was
    assert all(x >= y for x, y in zip(st.accepted_per_position, st.accepted_per_position[1:]))
    if st.n_steps:
        assert st.mean_accepted_length == pytest.approx(1 + st.n_accepted / st.n_steps)



# On the real Qwen2.5-Coder pair a near-tie is a margin within the batch-shape noise of the target's logits:
# llama.cpp's batched and single-token kernels differ, and on this pair on x86 CPU kernels the top-1/top-2 margin
# moves by up to ~0.3 logits between the two (measured with forced-rejection runs, whose committed tokens all come
# from position 0 of a verify batch; a typical margin is several logits). Each test also measures that noise on its
# own prompt.
MIN_NEAR_TIE = 0.35


def solo(target, prompt, n_predict):
    """One sequence alone, without speculation, with margins: the reference of a continuous-batching run."""
    with SpecSession(target, None, SessionConfig(spec_types=[], margins=True, n_ctx=512)) as s:
        return s.generate(prompt, n_predict)


# (preset fixture, target n_embd, HF target layer ids) — ids < n_layer - 1 as upstream requires
TARGETS = {"dense": ("dense_pair", 64, (0,)), "hybrid": ("hybrid_pair", 128, (0, 2))}


def make_dflash(tmp_path_factory, target_path, n_embd, layer_ids, version, vocab=512, **kw):
    d = tmp_path_factory.mktemp(f"dflash{version}")
    ckpt = write_dflash_checkpoint(d / "ckpt", version=version, hidden=n_embd, n_layers=1, n_heads=4, n_kv_heads=2,
                                   head_dim=n_embd // 4, intermediate=2 * n_embd, vocab=vocab,
                                   target_layer_ids=layer_ids, num_target_layers=None, mask_token_id=vocab - 1,
                                   dtype="f32", seed=11, **kw)
    return convert_dflash(ckpt, target_path, d / "drafter.gguf", outtype="f32")


# the shape of Qwen3's template: thinking is on unless enable_thinking is false, which closes an empty block
QWEN3_STYLE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


# A chat template that offers tools and writes calls as <tool_call>{"name": ..., "arguments": ...}</tool_call>
# (the shape of Qwen2.5's), for tool-call tests on the synthetic models.
TOOLS_STYLE = (
    "{%- if tools %}{{- '<|im_start|>system\\nYou may call these functions:\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}"
    "{{- 'Write each call as <tool_call>\\n{\"name\": <name>, \"arguments\": <args>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{{- call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def arm_session(target, drafter, d2, arm, **cfg):
    """A session of one benchmark-style arm: plain, n4 / n8 / adaptive (the draft model), dflash2 (fixed 7) or
    dflash2-adaptive; cfg: further SessionConfig fields (n_ctx 1024 unless given)."""
    cfg.setdefault("n_ctx", 1024)
    if arm == "plain":
        return SpecSession(target, None, SessionConfig(spec_types=[], **cfg))
    if arm == "dflash2":
        return SpecSession(target, d2, SessionConfig(spec_types="draft-dflash", adaptive=False, n_max=7, **cfg))
    if arm == "dflash2-adaptive":
        return SpecSession(target, d2, SessionConfig(spec_types="draft-dflash", n_max=7, **cfg))
    n_max = 4 if arm == "n4" else 8
    return SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], adaptive=arm == "adaptive",
                                                      n_max=n_max, **cfg))


def benchmark_script(name: str):
    """A script of benchmarks/ (not a package) imported as a module, for its tests."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
