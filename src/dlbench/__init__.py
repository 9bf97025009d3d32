"""dlbench: cross-framework deep-learning benchmarks with isolated runners and a versioned store.

The controller (this package) never imports a deep-learning framework.
"""

__version__ = "0.1.0"
