"""WebArena's own tasks on a user's deployment of its sites (docs/webarena.md)."""
