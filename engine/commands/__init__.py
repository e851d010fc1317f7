"""The `bunshin` commands: each module does one command's work, ``flags.py`` holds the flags several share (the
parser and dispatch are ``engine/cli.py``)."""
