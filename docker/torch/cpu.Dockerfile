# PyTorch, CPU flavour. The build context holds one file, requirements.txt: dlbench copies
# runners/torch/requirements-cpu.txt there, the same pins the venv backend installs.
FROM python:3.11.15-slim-bookworm

# PyPI's torch wheel for Linux x86_64 is the CUDA build (several GB of NVIDIA libraries); PyTorch's
# CPU index serves the same release as 2.13.0+cpu, which satisfies torch==2.13.0 and is preferred by
# pip over the plain version. A build argument, so it does not stay in the image's environment.
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu

COPY requirements.txt /opt/dlbench/requirements.txt
RUN python3 -m pip install --no-cache-dir --disable-pip-version-check \
        -r /opt/dlbench/requirements.txt
