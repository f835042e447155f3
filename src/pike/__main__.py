"""`python -m pike` runs the command line."""

from pike.cli import run

run()
