# TensorFlow, CUDA flavour: TensorFlow's own GPU image of the release pinned in
# runners/tensorflow/requirements-cuda.txt. pip keeps the image's tensorflow 2.21.0 and installs
# what the pins add: the `and-cuda` extra's NVIDIA wheels (CUDA 12, cuDNN 9), keras and numpy.
# Built and run on a GPU host: not yet (see README).
FROM tensorflow/tensorflow:2.21.0-gpu

COPY requirements.txt /opt/dlbench/requirements.txt
RUN python3 -m pip install --no-cache-dir --disable-pip-version-check \
        -r /opt/dlbench/requirements.txt
