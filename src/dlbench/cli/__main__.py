"""`python -m dlbench.cli`: the same command line as the `dlbench` entry point."""

from . import app

app()
