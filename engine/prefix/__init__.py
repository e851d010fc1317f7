"""Tool-prefix caching (issue 10): the prefix tree of workspace snapshots, its cold checkpoints, their writers."""
