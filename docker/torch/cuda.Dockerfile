# PyTorch, CUDA flavour: PyTorch's own runtime image of the release pinned in
# runners/torch/requirements-cuda.txt (torch 2.13.0 built for CUDA 12.6 with cuDNN 9). The venv sees
# the image's packages (--system-site-packages): its torch (2.13.0+cu126) satisfies torch==2.13.0, so
# pip keeps the image's build and adds the rest of the pins. CUDA 12.6: the host needs an NVIDIA
# driver of the 560 series or newer.
# The build context (made by dlbench) holds requirements.txt, a copy of runners/torch/requirements-cuda.txt,
# and wheelhouse/, every wheel it resolves to, downloaded on the host with the venv backend's pip
# configuration for this base image's Python; the install reads no index (--no-index). BASE_IMAGE
# is a build argument ($DLBENCH_BASE_IMAGE). Built and run on a GPU host: not yet (see README).
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime

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
