"""Task suites: loaders for the benchmarks' own task files and their evaluators (WebArena now; OSWorld next)."""
