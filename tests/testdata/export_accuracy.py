#!/usr/bin/python3
"""Test accuracy of a pipetrain model export, computed independently.

Reads the export with its own safetensors parsing (struct, json and
numpy.frombuffer; no pipetrain code), builds the forward pass from the
model spec in the export's metadata, reads the Fashion-MNIST test split
from its IDX files and prints one JSON line:
  {"accuracy": A, "loss": L, "samples": N}
Exits non-zero, saying why, for anything it does not understand.

Usage: export_accuracy.py MODEL.safetensors FASHION_MNIST_DIR
"""
import gzip
import json
import os
import struct
import sys

import numpy as np

# pipetrain's Fashion-MNIST input normalisation (pixel / 255 - mean) / std.
MEAN = np.float32(0.2860)
STD = np.float32(0.3530)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        sys.exit(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        sys.exit(f"{path}: header of {n} bytes runs past the file")
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    body = data[8 + n:]
    tensors = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            sys.exit(f"{path}: {name} is {t['dtype']}, expected F32")
        begin, end = t["data_offsets"]
        count = int(np.prod(t["shape"], dtype=np.int64))
        if end - begin != 4 * count or end > len(body):
            sys.exit(f"{path}: {name} has bad offsets {begin}..{end}")
        tensors[name] = np.frombuffer(body[begin:end], dtype="<f4").reshape(
            t["shape"])
    return metadata, tensors


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, rank = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        sys.exit(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    return np.frombuffer(data[4 + 4 * rank:], dtype=np.uint8).reshape(dims)


def find(directory, stem):
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(directory, name)):
            return os.path.join(directory, name)
    sys.exit(f"{directory}: no {stem}[.gz]")


def forward(model, tensors, x):
    for i, layer in enumerate(model["layers"]):
        if "linear" in layer:
            w = tensors[f"layers.{i}.weight"]  # [out, in], as nn.Linear
            x = x @ w.T
            if not layer["linear"].get("noBias", False):
                x = x + tensors[f"layers.{i}.bias"]
        elif "relu" in layer:
            x = np.maximum(x, np.float32(0))
        elif "dropout" in layer or "flatten" in layer:
            x = x.reshape(x.shape[0], -1)  # dropout is the identity here
        else:
            sys.exit(f"layer {i}: kind {sorted(layer)} not supported here")
    return x


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    metadata, tensors = read_safetensors(sys.argv[1])
    if metadata.get("format") != "pipetrain-export-v1":
        sys.exit(f"{sys.argv[1]}: not a pipetrain export")
    model = json.loads(metadata["model_spec"])
    images = read_idx(find(sys.argv[2], "t10k-images-idx3-ubyte"))
    labels = read_idx(find(sys.argv[2], "t10k-labels-idx1-ubyte"))
    x = images.reshape(images.shape[0], -1).astype(np.float32)
    x = (x / np.float32(255) - MEAN) / STD
    logits = forward(model, tensors, x).astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(len(labels)), labels].mean()
    accuracy = float((logits.argmax(axis=1) == labels).mean())
    print(json.dumps({"accuracy": accuracy, "loss": float(loss),
                      "samples": int(len(labels))}))


if __name__ == "__main__":
    main()
