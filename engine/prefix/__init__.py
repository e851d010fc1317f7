"""Tool-prefix caching (docs/prefix.md): the prefix tree of workspace snapshots, its cold checkpoints, their writers."""
