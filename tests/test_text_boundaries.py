"""Text and ids at every boundary: bytes that are not UTF-8 on the command line, lone surrogates in the API,
chat template files that are not regular files or are too large, token ids outside the vocabulary, numpy
integers. Each gives a typed error (or exit status 2 with `pyllamaspec: error:`), and the process goes on."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from clirun import CLI

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.errors import ConfigError
from pyllamaspec.textfiles import MAX_TEMPLATE_BYTES, read_text_file


def _cli(*argv) -> subprocess.CompletedProcess:
    args = [os.fsencode(a) if isinstance(a, str) else a for a in argv]
    return subprocess.run([*map(os.fsencode, CLI), *args], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def target(dense_pair):
    with Model(dense_pair[0]) as m:
        yield m


def test_a_non_utf8_prompt_on_the_command_line_is_exit_2_naming_it(dense_pair):
    r = _cli("generate", "-m", str(dense_pair[0]), "-p", b"caf\xe9", "-n", "2", "--raw")
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2, err
    assert "pyllamaspec: error: the prompt given with -p is not valid Unicode: byte 0xe9 at character 3 is not " \
           "UTF-8" in err
    assert "internal error" not in err and "Traceback" not in err


def test_a_model_path_of_non_utf8_bytes_is_opened(dense_pair, tmp_path):
    odd = os.path.join(os.fsencode(tmp_path), b"mod\xe9l.gguf")
    os.symlink(os.fsencode(dense_pair[0]), odd)
    with Model(os.fsdecode(odd)) as m:
        assert m.info.n_vocab > 0


def test_lone_surrogates_in_the_api_are_config_errors(target):
    with pytest.raises(ConfigError, match=r"text to tokenize is not valid Unicode: a lone surrogate U\+D800 at "
                                          r"character 1"):
        target.tokenize("a\ud800")
    with pytest.raises(ConfigError, match="message 0: its content is not valid Unicode"):
        target.apply_chat_template([{"role": "user", "content": "\udfff"}], template="chatml")
    with pytest.raises(ConfigError, match="chat template is not valid Unicode"):
        target.apply_chat_template([{"role": "user", "content": "x"}], template="{{ '\ud800' }}")
    with pytest.raises(TypeError, match="metadata key is a str"):
        target.meta(None)  # type: ignore[arg-type]
    assert target.tokenize("still works")


def test_detokenize_of_ids_outside_the_vocabulary_is_refused(target):
    n = target.info.n_vocab
    for bad in ([n], [-1], [2 ** 40], [1, 2, n + 5]):
        with pytest.raises(ConfigError, match=rf"outside the vocabulary \(0..{n - 1}\)"):
            target.detokenize(bad)
    with pytest.raises(TypeError, match="not an integer"):
        target.detokenize([1.5])
    with pytest.raises(TypeError, match="sequence of token ids"):
        target.detokenize("abc")
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        target.token_bytes(2 ** 40)
    ids = target.tokenize("hello world", add_special=False)
    assert target.detokenize(np.array(ids, dtype=np.int32)) == target.detokenize(ids)


def test_numpy_prompts_and_indices_are_accepted(dense_pair, target):
    with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=256, n_parallel=2)) as s:
        ref = s.generate([1, 5, 9, 2], 6).tokens
        assert s.generate(np.array([1, 5, 9, 2], dtype=np.int64), 6).tokens == ref
        with pytest.raises(ConfigError, match="outside the vocabulary"):
            s.detokenize([target.info.n_vocab])
        with pytest.raises(ConfigError, match=r"n_max=-5 must be within 0\.\."):
            s.submit([1, 2, 3], 4, n_max=-5)
        with pytest.raises(ConfigError, match=r"n_min=-2 must be within 0\.\."):
            s.submit([1, 2, 3], 4, n_min=-2)
        for name, value in (("top_k", -2 ** 40), ("top_k", 2 ** 40), ("seed", 2 ** 40), ("n_max", 2 ** 40),
                            ("temp", 1e308), ("min_p", -1e300)):
            with pytest.raises(ConfigError, match=f"{name}=") as e:
                s.submit([1, 2, 3], 4, **{name: value})
            assert e.value.param == name
        with pytest.raises(TypeError, match="a slot is an int"):
            s.cancel("0")
        assert s.cancel(np.int64(2 ** 40)) is False
        assert s.cancel(np.int32(1)) is False
        s.generate_batch([[1, 2, 3], [4, 5, 6]], 3)
        assert s.stream_stats(np.int64(1)).n_generated >= 0
        with pytest.raises(ConfigError, match="no stream"):
            s.stream_stats(2 ** 40)
        assert s.generate([1, 5, 9, 2], 6).tokens == ref


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "dir"])
def test_a_chat_template_file_must_be_a_regular_file(tmp_path, special):
    path = {"/dev/zero": "/dev/zero", "fifo": str(tmp_path / "t.fifo"), "dir": str(tmp_path)}[special]
    if special == "fifo":
        os.mkfifo(path)  # opening it must not block
    with pytest.raises(ConfigError, match="(not a regular file|a directory)"):
        read_text_file(path, "chat template file", MAX_TEMPLATE_BYTES)
    r = _cli("generate", "--chat-template-file", path, "-p", "x")
    err = r.stderr.decode()
    assert r.returncode == 2 and "chat template file" in err and "Traceback" not in err, err


def test_a_chat_template_file_is_size_capped_and_utf8(tmp_path):
    big = tmp_path / "big.jinja"
    big.write_bytes(b"x" * (MAX_TEMPLATE_BYTES + 1))
    with pytest.raises(ConfigError, match=f"more than the {MAX_TEMPLATE_BYTES}"):
        read_text_file(big, "chat template file", MAX_TEMPLATE_BYTES)
    latin = tmp_path / "latin.jinja"
    latin.write_bytes(b"caf\xe9")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        read_text_file(latin, "chat template file", MAX_TEMPLATE_BYTES)
    with pytest.raises(ConfigError, match="does not exist"):
        read_text_file(tmp_path / "nope", "chat template file", MAX_TEMPLATE_BYTES)
    ok = tmp_path / "ok.jinja"
    ok.write_text("{{ messages[0].content }}")
    assert read_text_file(ok, "chat template file", MAX_TEMPLATE_BYTES) == "{{ messages[0].content }}"


def test_yes_no_arguments_are_bools_not_anything_truthy(target):
    for call in (lambda v: target.tokenize("x", add_special=v), lambda v: target.token_bytes(1, v),
                 lambda v: target.apply_chat_template([{"role": "user", "content": "x"}], template="chatml",
                                                      add_generation_prompt=v)):
        for bad in (2 ** 40, "yes", None, 1.5):
            with pytest.raises(TypeError, match="must be True or False"):
                call(bad)
    assert target.tokenize("x", add_special=np.bool_(False)) == target.tokenize("x", add_special=False)
