"""The embedded web shop (WebArena "shopping" stand-in): catalog, search, and (next) the HTTP shop and browser."""
