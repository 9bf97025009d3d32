# PyTorch, CUDA flavour: PyTorch's own runtime image of the release pinned in
# runners/torch/requirements-cuda.txt (torch 2.13.0 built for CUDA 12.6 with cuDNN 9). Its torch
# (2.13.0+cu126) satisfies torch==2.13.0, so pip keeps the image's build and adds the rest of the
# pins. CUDA 12.6: the host needs an NVIDIA driver of the 560 series or newer. Built and run on a
# GPU host: not yet (see README).
FROM pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime

COPY requirements.txt /opt/dlbench/requirements.txt
RUN python3 -m pip install --no-cache-dir --disable-pip-version-check \
        -r /opt/dlbench/requirements.txt
