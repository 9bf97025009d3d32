# TensorFlow, CPU flavour: runners/tensorflow/requirements-cpu.txt (tensorflow-cpu, keras, numpy),
# copied into the build context as requirements.txt by dlbench.
FROM python:3.11.15-slim-bookworm

COPY requirements.txt /opt/dlbench/requirements.txt
RUN python3 -m pip install --no-cache-dir --disable-pip-version-check \
        -r /opt/dlbench/requirements.txt
