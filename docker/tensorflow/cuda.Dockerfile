# TensorFlow, CUDA flavour: TensorFlow's own GPU image of the release pinned in
# runners/tensorflow/requirements-cuda.txt. The venv sees the image's packages (--system-site-packages):
# pip keeps the image's tensorflow 2.21.0 and installs what the pins add: the `and-cuda` extra's
# NVIDIA wheels (CUDA 12, cuDNN 9), keras and numpy.
# The build context (made by dlbench) holds requirements.txt, a copy of runners/tensorflow/requirements-cuda.txt,
# and wheelhouse/, every wheel it resolves to, downloaded on the host with the venv backend's pip
# configuration for this base image's Python; the install reads no index (--no-index). BASE_IMAGE
# is a build argument ($DLBENCH_BASE_IMAGE). Built and run on a GPU host: not yet (see README).
ARG BASE_IMAGE=tensorflow/tensorflow:2.21.0-gpu

# The wheels are needed only to install: this stage installs them into a venv and the image
# below takes the venv alone (the wheelhouse would otherwise stay in a layer).
FROM ${BASE_IMAGE} AS install
# marks the stage's image, which the build leaves behind untagged, for dlbench to remove
LABEL org.dlbench.stage=install
COPY requirements.txt /opt/dlbench/requirements.txt
COPY wheelhouse /opt/dlbench/wheelhouse
RUN python3 -m venv --system-site-packages /opt/dlbench/venv \
    && /opt/dlbench/venv/bin/python3 -m pip install --no-cache-dir --disable-pip-version-check --no-index \
        --find-links /opt/dlbench/wheelhouse -r /opt/dlbench/requirements.txt

FROM ${BASE_IMAGE}
COPY --from=install /opt/dlbench/venv /opt/dlbench/venv
# the environment's python3 comes first on PATH: it is the `python3` dlbench runs
ENV PATH=/opt/dlbench/venv/bin:$PATH
