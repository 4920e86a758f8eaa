"""Composition roots of the subcommands: each builds the real objects once and runs them."""
