"""The `hotspec` command line: one module per subcommand (`main` dispatches)."""
