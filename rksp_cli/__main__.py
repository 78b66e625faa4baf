"""``python -m rksp_cli`` runs the command line."""

from rksp_cli.cli import app

app()
