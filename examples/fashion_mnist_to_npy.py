"""Writes Fashion-MNIST as .npy files for examples/fashion_mnist_npy.job.json.

Reads the IDX files of Debian's dataset-fashion-mnist package and saves the
images as uint8 [N, 784] and the labels as int64 [N]:

  python3 examples/fashion_mnist_to_npy.py /usr/share/datasets/fashion-mnist-npy
"""
import gzip
import os
import sys

import numpy as np

SRC = "/usr/share/datasets/fashion-mnist"
out = sys.argv[1] if len(sys.argv) > 1 else "fashion-mnist-npy"
os.makedirs(out, exist_ok=True)
for split, prefix in (("train", "train"), ("eval", "t10k")):
    with gzip.open(f"{SRC}/{prefix}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(f"{SRC}/{prefix}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    np.save(f"{out}/{split}-images.npy", images)
    np.save(f"{out}/{split}-labels.npy", labels)
