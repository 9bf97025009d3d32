"""The version of dlbench, in a module of its own so that any layer can read it without importing
the package (whose `load` reaches into the store)."""

__version__ = "0.2.0"
