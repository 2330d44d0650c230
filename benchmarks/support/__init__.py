"""What the benchmark scripts share; not a benchmark itself (the scripts import it as
`support`, their own folder being first on `sys.path`)."""
