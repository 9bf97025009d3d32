"""dlbench: cross-framework deep-learning benchmarks with isolated runners and a versioned store.

The controller (this package) never imports a deep-learning framework.
"""

from .version import __version__


def load(store, iterations: bool = False):
    """The runs of a results store as a pandas DataFrame: one row per run, or with iterations=True
    one row per measured iteration. See dlbench.store.frame.load (imported here on first use, so
    that the command line does not pay for pandas)."""
    from .store.frame import load as load_frame

    return load_frame(store, iterations=iterations)


__all__ = ["__version__", "load"]
