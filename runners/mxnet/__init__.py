"""The Apache MXNet runner (runner.toml says how dlbench builds its environment and starts it)."""
