# Apache MXNet, CPU flavour: runners/mxnet/requirements-cpu.txt (mxnet 1.9.1, numpy 1.23.5: wheels up
# to CPython 3.11, the Python of this base). mxnet's wheel loads GCC's OpenMP and quad-precision
# runtimes from the system (libgomp.so.1, libquadmath.so.0): the default base is python's full
# bookworm image, which has them (the slim one has not, and an offline build cannot apt-get them); a
# base of one's own must bring them too (the stand-in base of scripts/private-engine.sh does). The
# image imports mxnet as its last step: a base without them fails to build, naming the library.
# The build context (made by dlbench) holds requirements.txt, a copy of runners/mxnet/requirements-cpu.txt,
# and wheelhouse/, every wheel it resolves to, downloaded on the host with the venv backend's pip
# configuration for this base image's Python: the install reads no index (--no-index) and, for
# the CPU images, the build has no network. BASE_IMAGE is a build argument: a host without a
# registry passes a local image with Python 3.11 ($DLBENCH_BASE_IMAGE; README, Containers).
ARG BASE_IMAGE=python:3.11.15-bookworm

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
# a base without the system libraries mxnet loads fails here, by name, not at the first run
RUN python3 -c "import mxnet"
