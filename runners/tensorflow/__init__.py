"""The TensorFlow (Keras 3) runner (runner.toml says how dlbench builds its environment and starts it)."""
