# JAX, CUDA flavour. JAX publishes no image of its own; jax[cuda12] (runners/jax/requirements-cuda.txt)
# brings CUDA 12 and cuDNN as NVIDIA's pip wheels, so the base is NVIDIA's smallest CUDA image,
# `base` (the CUDA runtime and the driver compatibility check, no cuDNN or cuBLAS of its own that
# could shadow the wheels'). Ubuntu 24.04 for its Python 3.12: numpy 2.4 needs Python >= 3.11.
# NVIDIA's images declare their CUDA version (NVIDIA_REQUIRE_CUDA) and the NVIDIA container runtime
# will not start them on a driver without it: 560 or newer for 12.6.
# The build context (made by dlbench) holds requirements.txt, a copy of runners/jax/requirements-cuda.txt,
# and wheelhouse/, every wheel it resolves to, downloaded on the host with the venv backend's pip
# configuration for this base image's Python; the install reads no index (--no-index). BASE_IMAGE
# is a build argument ($DLBENCH_BASE_IMAGE). Built and run on a GPU host: not yet (see README).
ARG BASE_IMAGE=nvidia/cuda:12.6.3-base-ubuntu24.04

# The wheels are needed only to install: this stage installs them into a venv and the image
# below takes the venv alone (the wheelhouse would otherwise stay in a layer).
FROM ${BASE_IMAGE} AS install
# marks the stage's image, which the build leaves behind untagged, for dlbench to remove
LABEL org.dlbench.stage=install
# Ubuntu's archive keeps only the newest build of a package in -updates and -security, so exact
# apt pins would stop the image from building at the next security update; what is measured is
# fixed by the base image's tag and the pinned Python requirements (and each record names the
# image id it ran in). These steps need the archive: CUDA images are built with network.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
COPY requirements.txt /opt/dlbench/requirements.txt
COPY wheelhouse /opt/dlbench/wheelhouse
RUN python3 -m venv /opt/dlbench/venv \
    && /opt/dlbench/venv/bin/python3 -m pip install --no-cache-dir --disable-pip-version-check --no-index \
        --find-links /opt/dlbench/wheelhouse -r /opt/dlbench/requirements.txt

FROM ${BASE_IMAGE}
# Ubuntu's archive keeps only the newest build of a package in -updates and -security, so exact
# apt pins would stop the image from building at the next security update; what is measured is
# fixed by the base image's tag and the pinned Python requirements (and each record names the
# image id it ran in). These steps need the archive: CUDA images are built with network.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=install /opt/dlbench/venv /opt/dlbench/venv
# the environment's python3 comes first on PATH: it is the `python3` dlbench runs
ENV PATH=/opt/dlbench/venv/bin:$PATH
