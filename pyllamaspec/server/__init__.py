"""An OpenAI-compatible HTTP server over one speculative session (continuous batching); the `serve` command
(`pyllamaspec.cli.serve`) runs it.

Needs the server extra (pip install 'pyllamaspec[server]'); nothing here imports it until the server is created.
"""
