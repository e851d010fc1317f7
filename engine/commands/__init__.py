"""The `bunshin` commands: each module does one command's work (the parser and dispatch are ``engine/cli.py``)."""
