# JAX, CPU flavour: runners/jax/requirements-cpu.txt (jax, jaxlib's XLA:CPU build, flax, optax),
# copied into the build context as requirements.txt by dlbench.
FROM python:3.11.15-slim-bookworm

COPY requirements.txt /opt/dlbench/requirements.txt
RUN python3 -m pip install --no-cache-dir --disable-pip-version-check \
        -r /opt/dlbench/requirements.txt
