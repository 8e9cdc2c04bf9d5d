"""`zero-train` subcommands: one file each, `main.py` only registers them (accelerate's layout)."""
