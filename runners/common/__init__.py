"""What every runner shares: the contract (runners.common.contract), the worker protocol and the
harnesses that time a runner's objects."""
