"""The server's defaults for what a request leaves out, where they are llama-server's rather than the API's:
a request without `temperature` samples at llama-server's 0.8 (upstream's common_params_sampling.temp), and
`serve --temp T` sets that default, as llama-server's --temp does. Importing this module needs no server extra
(`serve --help` shows these values)."""

from __future__ import annotations

TEMPERATURE = 0.8
