"""The `pyllamaspec` command: one module per subcommand, shared flag groups (flags), one error format (app).

Flags follow llama.cpp's names so command lines carry over. `python -m pyllamaspec.cli` runs it too.
"""


def main(argv=None) -> int:
    from .app import main as run_main

    return run_main(argv)
