"""SessionConfig / ModelConfig refuse what the native structs cannot hold, with a ConfigError naming the field."""

from __future__ import annotations

import math

import pytest

from pyllamaspec import ModelConfig, SessionConfig
from pyllamaspec.config import DEFAULT_N_MAX
from pyllamaspec.errors import ConfigError


def test_the_draft_ceiling_has_one_default() -> None:
    assert SessionConfig().n_max == DEFAULT_N_MAX


@pytest.mark.parametrize("field", ["temp", "top_p", "min_p", "p_min"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"{field}=.* must be a finite number"):
        SessionConfig(**{field: value})


@pytest.mark.parametrize(("field", "value", "message"), [
    ("n_ctx", 2 ** 31, r"n_ctx=2147483648 must be within 8\.\.2147483647"),
    ("n_batch", -1, r"n_batch=-1 must be within 1\.\."),
    ("n_threads", 2 ** 40, r"n_threads=\d+ must be within 0\.\."),
    ("top_k", 2 ** 31, r"top_k=2147483648 must be within -2147483648\.\.2147483647"),
    ("seed", 2 ** 32, r"seed=4294967296 must be within 0\.\.4294967295"),
    ("seed", -1, r"seed=-1 must be within 0\.\.4294967295"),
    ("ngram_size_n", 70_000, r"ngram_size_n=70000 must be within 0\.\.65535"),
    ("ngram_mod_n_max", -3, r"ngram_mod_n_max=-3 must be within 0\.\."),
    ("n_rs_seq", 65, r"n_rs_seq=65 must be within 0\.\.64"),
])
def test_out_of_range_ints_are_refused(field: str, value: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SessionConfig(**{field: value})


@pytest.mark.parametrize("field", ["n_ctx", "n_max", "seed", "top_k", "n_parallel", "ngram_size_m"])
@pytest.mark.parametrize("value", [None, 3.5, "8", True])
def test_int_fields_take_ints_only(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"{field}=.* must be an integer"):
        SessionConfig(**{field: value})


@pytest.mark.parametrize(("field", "value"), [("flash_attn", "on"), ("margins", 1), ("force_reject", None),
                                              ("draft_backend_sampling", "yes")])
def test_switches_take_bools(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        SessionConfig(**{field: value})


@pytest.mark.parametrize("value", [b"draft-simple", 5, [1, 2]])
def test_spec_types_are_names(value: object) -> None:
    with pytest.raises(ConfigError, match="speculative type"):
        SessionConfig(spec_types=value)


def test_at_most_the_headers_number_of_spec_types() -> None:
    types = ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "draft-simple",
             "draft-mtp", "draft-eagle3", "draft-dflash"]
    with pytest.raises(ConfigError, match="at most 8"):
        SessionConfig(spec_types=types)


def test_valid_values_pass_and_are_normalised() -> None:
    cfg = SessionConfig(spec_types="draft,ngram-mod", n_max=8, seed=0xFFFFFFFF, top_k=-1, temp=0.7,
                        cache_type_k="Q8_0", flash_attn=None, n_rs_seq=0)
    assert cfg.spec_types == ("draft-simple", "ngram-mod")
    m = ModelConfig(devices="CUDA0, CUDA1", tensor_split=[3, 1], tensor_overrides="exps=CPU", split_mode="ROW")
    assert (m.devices, m.tensor_split, m.tensor_overrides, m.split_mode) == (
        ("CUDA0", "CUDA1"), (3.0, 1.0), ("exps=CPU",), "row")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_gpu_layers": None}, r"n_gpu_layers=None must be an integer"),
    ({"n_gpu_layers": -2}, r"n_gpu_layers=-2 must be within -1\.\."),
    ({"main_gpu": 2 ** 31}, r"main_gpu=2147483648 must be within 0\.\."),
    ({"n_cpu_moe": 1.5}, r"n_cpu_moe=1.5 must be an integer"),
    ({"tensor_split": [1, math.nan]}, r"tensor_split\[1\]=nan must be a finite number"),
    ({"tensor_split": "3,1"}, r"tensor_split='3,1' must be a list"),
    ({"devices": [b"CUDA0"]}, r"devices=.* must be a list of strings"),
    ({"use_mmap": 0}, r"use_mmap=0 must be True or False"),
    ({"load_mtp": "auto"}, r"load_mtp='auto' must be True, False or None"),
    ({"split_mode": 1}, r"split_mode=1: use one of none, layer, row, tensor"),
])
def test_model_config_refuses_what_the_loader_cannot_take(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**kwargs)


def test_numpy_scalars_and_arrays_are_taken_where_numbers_and_lists_are(dense_pair):
    import numpy as np

    from pyllamaspec import Model, SpecSession
    from pyllamaspec.config import ModelConfig

    m = ModelConfig(tensor_split=np.array([1.0, 3.0]), n_gpu_layers=np.int32(0))
    assert m.tensor_split == (1.0, 3.0) and all(type(x) is float for x in m.tensor_split)
    c = SessionConfig(n_ctx=np.int64(256), n_threads=np.int16(1), adaptive=False, spec_types="draft-simple",
                      draft_schedule=np.array([2, 3]))
    assert c.draft_schedule == (2, 3) and all(type(k) is int for k in c.draft_schedule)
    assert SessionConfig(synth_rates=np.array([0.9, 0.5])).synth_rates == (0.9, 0.5)
    with pytest.raises(ConfigError, match=r"n_ctx=.*256\.0.* must be an integer"):
        SessionConfig(n_ctx=np.float64(256))
    with pytest.raises(ConfigError, match="draft_schedule"):
        SessionConfig(adaptive=False, draft_schedule=np.array([[1, 2]]))
    target, _ = dense_pair
    with Model(target, n_gpu_layers=np.int64(0)) as model, \
            SpecSession(model, None, SessionConfig(spec_types=[], n_ctx=np.int64(256), n_threads=np.int64(1))) as s:
        assert len(s.generate(np.array([1, 2, 3]), 4).tokens) == 4


def test_thread_counts_beyond_what_llama_cpp_takes_are_refused():
    from pyllamaspec.config import MAX_THREADS

    for name in ("n_threads", "n_threads_batch", "n_threads_draft"):
        with pytest.raises(ConfigError, match=rf"{name}=2147483647 must be within 0..{MAX_THREADS}"):
            SessionConfig(**{name: 2 ** 31 - 1})
    assert SessionConfig(n_threads=MAX_THREADS).n_threads == MAX_THREADS


# -- one sequence's settings -------------------------------------------------------------------------------------

def test_sequence_params_take_numpy_scalars_as_python_numbers() -> None:
    np = pytest.importorskip("numpy")
    from pyllamaspec.config import SequenceParams

    p = SequenceParams(n_predict=np.int64(12), temp=np.float32(0.5), top_k=np.int32(8), top_p=np.float64(0.9),
                       seed=np.uint32(7), n_max=np.int16(3), p_min=np.float32(0.25))
    assert (p.n_predict, p.top_k, p.seed, p.n_max) == (12, 8, 7, 3)
    assert type(p.n_predict) is int and type(p.top_k) is int and type(p.temp) is float
    assert p.temp == 0.5 and p.top_p == pytest.approx(0.9) and p.p_min == 0.25
    assert p.given() == {"n_predict": 12, "temp": 0.5, "top_k": 8, "top_p": p.top_p, "seed": 7, "n_max": 3,
                         "p_min": 0.25}


@pytest.mark.parametrize(("field", "value"), [("top_k", 2.0), ("top_k", "8"), ("seed", True), ("temp", "hot"),
                                              ("n_predict", None), ("n_max", 1.5), ("p_min", [0.1])])
def test_sequence_params_of_the_wrong_type_are_type_errors(field: str, value: object) -> None:
    from pyllamaspec.config import SequenceParams
    from pyllamaspec.errors import ConfigTypeError

    with pytest.raises(TypeError, match=rf"^{field}=") as info:
        SequenceParams(**{field: value})
    assert isinstance(info.value, ConfigTypeError) and isinstance(info.value, ConfigError)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("n_predict", -2, r"^n_predict=-2 must be within -1\.\.2147483647"),
    ("top_k", -1, r"^top_k=-1 must be within 0\.\.16777216"),
    ("top_k", 2 ** 30, r"^top_k=1073741824 must be within 0\.\.16777216"),
    ("top_p", 1.5, r"^top_p=1\.5 must be within 0\.0\.\.1\.0"),
    ("min_p", -0.1, r"^min_p=-0\.1 must be within 0\.0\.\.1\.0"),
    ("p_min", 2.0, r"^p_min=2\.0 must be within 0\.0\.\.1\.0"),
    ("temp", math.nan, r"^temp=nan must be a finite number"),
    ("seed", 2 ** 32, r"^seed=4294967296 must be within 0\.\.4294967295"),
    ("n_max", 65, r"^n_max=65 must be within 0\.\.64"),
    ("n_min", -1, r"^n_min=-1 must be within 0\.\.64"),
])
def test_sequence_params_out_of_range_name_the_field(field: str, value: object, message: str) -> None:
    from pyllamaspec.config import SequenceParams

    with pytest.raises(ValueError, match=message) as info:
        SequenceParams(**{field: value})
    assert isinstance(info.value, ConfigError) and not isinstance(info.value, TypeError)


def test_a_sessions_defaults_and_a_sequences_settings_share_their_limits() -> None:
    from pyllamaspec.config import SEQUENCE_LIMITS, SequenceParams

    for field in ("top_p", "min_p", "p_min", "n_max", "seed"):
        _integer, _lo, hi, _hint = SEQUENCE_LIMITS[field]
        over = hi + 1
        with pytest.raises(ConfigError) as session_error:
            SessionConfig(**{field: over})
        with pytest.raises(ConfigError) as sequence_error:
            SequenceParams(**{field: over})
        assert str(session_error.value) == f"SessionConfig.{sequence_error.value}"


def test_the_servers_request_schema_holds_to_the_sequence_limits() -> None:
    pytest.importorskip("pydantic")
    from pydantic import ValidationError

    from pyllamaspec.config import SEQUENCE_LIMITS
    from pyllamaspec.server.schemas import CompletionRequest

    for field, wire in (("top_k", "top_k"), ("top_p", "top_p"), ("min_p", "min_p")):
        _integer, lo, hi, _hint = SEQUENCE_LIMITS[field]
        CompletionRequest(prompt="x", **{wire: hi})
        CompletionRequest(prompt="x", **{wire: lo})
        with pytest.raises(ValidationError):
            CompletionRequest(prompt="x", **{wire: hi + 1})
    for field in ("n_max", "n_min", "p_min"):
        _integer, lo, hi, _hint = SEQUENCE_LIMITS[field]
        assert CompletionRequest(prompt="x", speculative={field: hi}).draft_settings() == {field: hi}
        with pytest.raises(ValidationError):
            CompletionRequest(prompt="x", speculative={field: hi + 1})
