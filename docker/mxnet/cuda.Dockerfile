# Apache MXNet, CUDA flavour: mxnet-cu117 1.9.1 (runners/mxnet/requirements-cuda.txt), the last
# release, built against CUDA 11.7 and cuDNN 8 and not bundling them: libmxnet.so needs the CUDA 11
# runtime libraries, cuDNN 8 and NCCL 2 on the loader path. NVIDIA's CUDA 11.7 runtime image with
# cuDNN 8 has exactly those (the runtime flavour includes NCCL). Its Ubuntu 22.04 brings Python
# 3.10, which the wheel (py3-none) and numpy 1.23.5 (wheels for CPython 3.8-3.11; mxnet 1.9.1 needs
# numpy < 1.24 for np.bool) both support. The image declares CUDA 11.7, so the host's driver must
# support it (515 or newer). Built and run on a GPU host: not yet (see README).
FROM nvidia/cuda:11.7.1-cudnn8-runtime-ubuntu22.04

# libgomp1: mxnet's wheel loads GCC's OpenMP runtime from the system. Ubuntu keeps only the newest
# build of a package in -updates and -security, so exact apt pins would stop the image from building
# at the next security update; the base tag and the pinned Python requirements fix what is measured.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-pip libgomp1 \
    && rm -rf /var/lib/apt/lists/*

COPY requirements.txt /opt/dlbench/requirements.txt
RUN python3 -m pip install --no-cache-dir --disable-pip-version-check -r /opt/dlbench/requirements.txt
