"""attnres command line (Typer + rich): parse, call the library, render."""
