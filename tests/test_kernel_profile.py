"""benchmarks/kernel_profile.py: a decoding step's kernels read off Nsight Compute's per-kernel CSV - the step found
as the period of the launch sequence's tail, its device time, and where two runs' steps differ."""

from __future__ import annotations

import gzip

import pytest

from helpers import benchmark_script

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


@pytest.fixture(scope="module")
def kp():
    return benchmark_script("kernel_profile")


def write(path, kernels, unit="usecond"):
    rows = [HEADER]
    for i, (name, v) in enumerate(kernels):
        rows.append(f'"{i}","1","python3","h","{name}","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","Command line '
                    f'profiler metrics","gpu__time_duration.sum","{unit}","{v}"')
    path.write_text("==PROF== Connected to process 1\n" + "\n".join(rows) + "\n==PROF== Disconnected\n")
    return path


def step(extra=()):
    return [("void rms_norm_f32<256>(const float *, float *)", 2.0),
            ("void mul_mat_vec_q<(ggml_type)2, 1>(const void *)", 10.0),
            ("void flash_attn_ext_vec<128, 1>(const char *)", 3.0),
            ("void mul_mat_vec_q<(ggml_type)2, 1>(const void *)", 20.0),
            ("void rms_norm_f32<256>(const float *, float *)", 2.0),
            ("void mul_mat_vec_q<(ggml_type)2, 1>(const void *)", 30.0),
            ("void k_get_rows_float<float, float>(const float *)", 1.0),
            ("void add_f32(const float *)", 1.5), *extra]


def test_the_steady_step_is_the_period_of_the_launch_sequences_tail(kp, tmp_path, capsys):
    prefill = [("void mul_mat_q<(ggml_type)2, 64>(const char *)", 500.0)] * 5
    ours = write(tmp_path / "ours.csv", prefill + step([("void argmax_f32(const float *)", 4.0)]) * 6)
    theirs = write(tmp_path / "theirs.csv", step() * 5, unit="ns")
    s = kp.summary(kp.read_kernels(ours))
    assert s["kernels_per_step"] == 9 and s["steps"] == 6 and s["step_us"] == pytest.approx(73.5)
    assert s["by_name"]["mul_mat_vec_q<>"] == (3, 60.0) and s["by_name"]["argmax_f32"] == (1, 4.0)
    t = kp.summary(kp.read_kernels(theirs))  # nanoseconds read as such
    assert t["kernels_per_step"] == 8 and t["step_us"] == pytest.approx(0.0695)
    packed = tmp_path / "theirs.csv.gz"
    packed.write_bytes(gzip.compress(theirs.read_bytes()))
    assert kp.summary(kp.read_kernels(packed)) == t
    assert kp.main([str(ours), str(theirs)]) == 0
    out = capsys.readouterr().out
    assert "9 kernels a step, 6 steady steps, 73.5" in out and "argmax_f32  1, 4.0  0, 0.0" in out


def test_a_file_that_is_not_such_a_csv_is_refused_with_its_name(kp, tmp_path, capsys):
    bad = tmp_path / "log.txt"
    bad.write_text("llama-bench: error\n")
    assert kp.main([str(bad)]) == 2
    assert "log.txt: no CSV rows" in capsys.readouterr().err
    noise = write(tmp_path / "noise.csv", [(f"void k{i}(int)", 1.0) for i in range(30)])
    assert kp.main([str(noise)]) == 2
    assert "noise.csv: no repeating step" in capsys.readouterr().err
    broken = tmp_path / "broken.csv"
    broken.write_text(HEADER.replace('"Kernel Name"', '"Name"') + '\n"0","1","p","h","k","1","7","(1)","(1)","0","9.0",'
                      '"s","gpu__time_duration.sum","ns","5"\n')
    assert kp.main([str(broken)]) == 2
    assert "broken.csv: a row without a kernel name" in capsys.readouterr().err
