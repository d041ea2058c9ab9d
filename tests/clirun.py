"""The command line of the package these tests imported.

`python -m pyllamaspec.cli` would put the working directory first on sys.path, and from a source checkout
that is the source tree (no native library) rather than the installed package under test."""

from __future__ import annotations

import sys
from pathlib import Path

import pyllamaspec

PACKAGE_ROOT = str(Path(pyllamaspec.__file__).resolve().parent.parent)
CLI = [sys.executable, "-c",
       f"import sys; sys.path.insert(0, {PACKAGE_ROOT!r}); from pyllamaspec.cli.app import main; sys.exit(main())"]
