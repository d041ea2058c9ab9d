"""`pyllamaspec serve`: an OpenAI-compatible HTTP server over one speculative session (continuous batching).

Needs the server extra (pip install 'pyllamaspec[server]'); nothing here imports it until the command runs.
"""

from .command import register

__all__ = ["register"]
