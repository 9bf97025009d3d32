# Apache MXNet, CUDA flavour: mxnet-cu117 1.9.1 (runners/mxnet/requirements-cuda.txt), the last
# release, built against CUDA 11.7 and cuDNN 8 and not bundling them: libmxnet.so needs the CUDA 11
# runtime libraries, cuDNN 8 and NCCL 2 on the loader path. NVIDIA's CUDA 11.7 runtime image with
# cuDNN 8 has exactly those (the runtime flavour includes NCCL). Its Ubuntu 22.04 brings Python
# 3.10, which the wheel (py3-none) and numpy 1.23.5 (wheels for CPython 3.8-3.11; mxnet 1.9.1 needs
# numpy < 1.24 for np.bool) both support. The image declares CUDA 11.7, so the host's driver must
# support it (515 or newer). libgomp1: mxnet's wheel loads GCC's OpenMP runtime from the system.
# The build context (made by dlbench) holds requirements.txt, a copy of runners/mxnet/requirements-cuda.txt,
# and wheelhouse/, every wheel it resolves to, downloaded on the host with the venv backend's pip
# configuration for this base image's Python; the install reads no index (--no-index). BASE_IMAGE
# is a build argument ($DLBENCH_BASE_IMAGE). Built and run on a GPU host: not yet (see README).
ARG BASE_IMAGE=nvidia/cuda:11.7.1-cudnn8-runtime-ubuntu22.04

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
    && apt-get install -y --no-install-recommends python3 python3-venv libgomp1 \
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
    && apt-get install -y --no-install-recommends python3 libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=install /opt/dlbench/venv /opt/dlbench/venv
# the environment's python3 comes first on PATH: it is the `python3` dlbench runs
ENV PATH=/opt/dlbench/venv/bin:$PATH
