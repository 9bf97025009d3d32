# Apache MXNet, CPU flavour: runners/mxnet/requirements-cpu.txt (mxnet 1.9.1, numpy 1.23.5), copied
# into the build context as requirements.txt by dlbench. numpy 1.23.5 has wheels up to CPython 3.11,
# the Python of this base (bookworm, pinned: the apt pin below is bookworm's build).
FROM python:3.11.15-slim-bookworm

# mxnet's wheel loads the system's GCC OpenMP runtime (libgomp.so.1); the slim image lacks it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1=12.2.0-14+deb12u1 \
    && rm -rf /var/lib/apt/lists/*

COPY requirements.txt /opt/dlbench/requirements.txt
RUN python3 -m pip install --no-cache-dir --disable-pip-version-check \
        -r /opt/dlbench/requirements.txt
