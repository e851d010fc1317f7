"""Applications that run inside workspaces (the web shop and desktop suites grow here)."""
