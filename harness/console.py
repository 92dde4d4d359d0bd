"""The terminal: rich consoles for the tables of the CLI, the bench and the audit."""

from __future__ import annotations

from typing import Any


def wide_console() -> Any:
    """A rich console; when output is not a terminal (piped, CI logs) it is 200 columns wide, so
    the tables are not cut to the 80-column default."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console.width = 200
    return console
