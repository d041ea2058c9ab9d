"""Where pyllamaspec keeps what it downloads and learns: ``$PYLLAMASPEC_CACHE``, else ``$XDG_CACHE_HOME/pyllamaspec``,
else ``~/.cache/pyllamaspec``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("PYLLAMASPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"), "pyllamaspec")
    return Path(base)
