"""The build: binding vs library, build facts, and the vendored upstream tree."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pycparser import c_ast, c_parser

from pyllamaspec import _native

ROOT = Path(__file__).resolve().parent.parent
PIN_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def declared_functions(source: str) -> list[str]:
    source = re.sub(r"/\*.*?\*/|//[^\n]*", " ", source, flags=re.S)  # pycparser takes no comments
    std_types = "typedef int int32_t; typedef unsigned uint32_t; typedef long int64_t; " \
                "typedef unsigned long uint64_t; typedef unsigned long size_t;\n"
    ast = c_parser.CParser().parse(std_types + source)
    return [n.name for n in ast.ext if isinstance(n, c_ast.Decl) and isinstance(n.type, c_ast.FuncDecl)]


def test_every_declared_function_is_exported_by_the_library():
    ffi, lib = _native.load()
    names = declared_functions(_native.cdef_source())
    assert len(names) >= 20
    missing = [n for n in names if not hasattr(lib, n)]
    assert missing == [], f"declared in pyllamaspec.h but not exported by libpyllamaspec.so: {missing}"


def test_check_catches_a_function_the_library_lacks(tmp_path):
    # the same check against a header that declares one function too many must fail
    header = tmp_path / "pyllamaspec.h"
    text = _native.HEADER.read_text().replace(
        "/* PLS_CDEF_END */", "int32_t pls_function_that_does_not_exist(void);\n/* PLS_CDEF_END */")
    header.write_text(text)
    from cffi import FFI
    ffi = FFI()
    ffi.cdef(_native.cdef_source(header))
    lib = ffi.dlopen(str(_native.lib_dir() / "libpyllamaspec.so"))
    names = declared_functions(_native.cdef_source(header))
    assert [n for n in names if not hasattr(lib, n)] == ["pls_function_that_does_not_exist"]


def test_abi_version_matches():
    ffi, lib = _native.load()
    assert lib.pls_abi_version() == _native.ABI_VERSION


def test_every_status_code_of_the_header_is_one_exception_and_the_library_returns_them():
    from pyllamaspec._native import calls

    codes = {name: value for name, value in _native.constants().items() if name.startswith("PLS_ERR_")}
    assert len(set(codes.values())) == len(codes) and all(v < 0 for v in codes.values())
    assert set(codes) - {"PLS_ERR_INTERNAL"} == set(calls._STATUS_ERRORS)
    assert isinstance(_native.error_for(codes["PLS_ERR_INTERNAL"], "x", RuntimeError), RuntimeError)
    # the library answers with the header's values: an unopenable file, then a session over nothing
    ffi, lib = _native.load()
    err = _native.ErrorBuffer(ffi)
    model = ffi.new("pls_model **")
    path = ffi.new("char[]", b"/nonexistent/model.gguf")
    params = ffi.new("pls_model_params *", {"path": path, "use_mmap": 1})
    assert lib.pls_model_load(params, model, err.buf, err.SIZE) == codes["PLS_ERR_LOAD"]
    assert model[0] == ffi.NULL and "model.gguf" in err.text


def test_info_reports_pin_patches_and_backend():
    out = subprocess.run(["pyllamaspec", "info", "--json"], capture_output=True,
                         text=True, check=True)
    info = json.loads(out.stdout)
    assert info["upstream"]["commit"] == PIN_COMMIT
    series = [l.strip() for l in (ROOT / "patches" / "series").read_text().splitlines() if l.strip()]
    assert info["patches"] == series
    assert "cpu" in info["backends"]
    assert any(d["type"] == "cpu" for d in info["devices"])


def test_installed_libraries_find_each_other_without_ld_library_path():
    lib = _native.lib_dir() / "libpyllamaspec.so"
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    if _native.lib_dir().name == "lib":  # installed layout (a build tree uses absolute build RPATHs)
        assert "$ORIGIN" in out


# ---- vendoring -------------------------------------------------------------------------------

import vendor  # tools/vendor.py (conftest puts tools/ on the path)


@pytest.fixture(scope="module")
def carrier() -> Path:
    pin = vendor.load_pin()
    path = vendor.cache_dir() / "carrier" / pin["carrier"]["filename"]
    if not path.exists():
        pytest.skip("the carrier sdist is not cached here (the build fetches it)")
    return path


def test_vendor_tree_is_recreated_from_the_carrier(tmp_path, carrier, monkeypatch):
    monkeypatch.setenv(vendor.SOURCE_ENV, str(carrier))
    dest = tmp_path / "llama.cpp"
    stamp = vendor.populate(dest)
    assert stamp["commit"] == PIN_COMMIT
    assert (dest / "src" / "llama.cpp").exists() and not (dest / "docs").exists()
    shutil.rmtree(dest / "src")
    (dest / vendor.STAMP_NAME).unlink()
    vendor.populate(dest)  # deleted: recreated
    assert (dest / "src" / "llama-model.cpp").exists()
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    assert size < 40 * 2**20, f"populated tree is {size / 2**20:.0f} MiB"


def test_patches_are_applied_once_and_idempotently(tmp_path, carrier, monkeypatch):
    monkeypatch.setenv(vendor.SOURCE_ENV, str(carrier))
    dest = tmp_path / "llama.cpp"
    vendor.populate(dest)
    ext = (dest / "src" / "llama-ext.h").read_text()
    assert ext.count("llama_model_dev_output") == 1
    vendor.populate(dest)  # a second run is a no-op, not a second application
    assert (dest / "src" / "llama-ext.h").read_text().count("llama_model_dev_output") == 1


def test_corrupted_carrier_is_refused(tmp_path, carrier, monkeypatch):
    bad = tmp_path / carrier.name
    data = bytearray(carrier.read_bytes()[:1_000_000])
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    monkeypatch.setenv(vendor.SOURCE_ENV, str(bad))
    with pytest.raises(vendor.VendorError, match="sha256"):
        vendor.populate(tmp_path / "llama.cpp")
    assert not (tmp_path / "llama.cpp").exists()


def test_broken_patch_fails_naming_the_patch(tmp_path, carrier, monkeypatch):
    monkeypatch.setenv(vendor.SOURCE_ENV, str(carrier))
    broken = tmp_path / "0099-broken.patch"
    broken.write_text("Why: test\nUpstream: none\nTested-by: this test\n\n"
                      "--- a/src/llama.cpp\n+++ b/src/llama.cpp\n@@ -1,3 +1,3 @@\n-this line is not there\n"
                      "+nor is this one\n context\n")
    patches = vendor.patch_series() + [vendor.Patch(broken, vendor.parse_patch_header(broken))]
    with pytest.raises(vendor.VendorError, match="0099-broken.patch"):
        vendor.populate(tmp_path / "llama.cpp", patches)


def test_every_patch_has_a_header():
    patches = vendor.patch_series()
    assert patches, "the series is empty"
    assert vendor.check_patch_headers(patches) == []


def test_no_source_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(vendor.SOURCE_ENV, str(tmp_path / "missing.tar.gz"))
    with pytest.raises(vendor.VendorError, match="does not exist"):
        vendor.populate(tmp_path / "llama.cpp")
