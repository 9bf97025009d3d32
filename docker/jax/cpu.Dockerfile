# JAX, CPU flavour: runners/jax/requirements-cpu.txt (jax, jaxlib's XLA:CPU build, flax, optax).
# The build context (made by dlbench) holds requirements.txt, a copy of runners/jax/requirements-cpu.txt,
# and wheelhouse/, every wheel it resolves to, downloaded on the host with the venv backend's pip
# configuration for this base image's Python: the install reads no index (--no-index) and, for
# the CPU images, the build has no network. BASE_IMAGE is a build argument: a host without a
# registry passes a local image with Python 3.11 ($DLBENCH_BASE_IMAGE; README, Containers).
ARG BASE_IMAGE=python:3.11.15-slim-bookworm

# The wheels are needed only to install: this stage installs them into a venv and the image
# below takes the venv alone (the wheelhouse would otherwise stay in a layer, doubling the size).
FROM ${BASE_IMAGE} AS install
# marks the stage's image, which the build leaves behind untagged, for dlbench to remove
LABEL org.dlbench.stage=install
COPY requirements.txt /opt/dlbench/requirements.txt
COPY wheelhouse /opt/dlbench/wheelhouse
RUN python3 -m venv /opt/dlbench/venv \
    && /opt/dlbench/venv/bin/python3 -m pip install --no-cache-dir --disable-pip-version-check --no-index \
        --find-links /opt/dlbench/wheelhouse -r /opt/dlbench/requirements.txt

FROM ${BASE_IMAGE}
COPY --from=install /opt/dlbench/venv /opt/dlbench/venv
# the environment's python3 comes first on PATH: it is the `python3` dlbench runs
ENV PATH=/opt/dlbench/venv/bin:$PATH
