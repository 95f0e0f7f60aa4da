#!/usr/bin/env python3
"""An independent safetensors reader and writer (numpy, json and struct only).

Checks pipetrain's C++ reader and writer against the format as written down,
not against themselves:

  safetensors_reference.py read FILE    prints {"metadata": {...}, "tensors":
                                        {name: {"dtype", "shape", "values"}}}
  safetensors_reference.py write FILE   writes the file the C++ test expects
"""
import json
import struct
import sys

import numpy as np

# Little-endian numpy types of the format's dtypes. BF16 has none: it is
# read as uint16 and widened to float32 by hand (its high 16 bits).
DTYPES = {
    "BOOL": "?", "U8": "<u1", "I8": "<i1", "I16": "<i2", "U16": "<u2",
    "F16": "<f2", "I32": "<i4", "U32": "<u4", "F32": "<f4", "F64": "<f8",
    "I64": "<i8", "U64": "<u8", "BF16": "<u2",
}


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", {})
    end_of_data = 0
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]])
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        arr = arr.reshape(info["shape"])
        end_of_data = max(end_of_data, end)
        tensors[name] = {
            "dtype": info["dtype"],
            "shape": list(info["shape"]),
            "values": arr.astype(np.float64).reshape(-1).tolist()
            if arr.dtype.kind == "f" else arr.reshape(-1).tolist(),
        }
    assert end_of_data == len(data), "data section not fully used"
    print(json.dumps({"metadata": metadata, "tensors": tensors}))


def write(path):
    # Insertion order (not sorted), explicit little-endian bytes, header
    # padded with spaces to a multiple of 8 as the reference writer does.
    arrays = {
        "layers.1.weight": ("F32", (np.arange(6, dtype="<f4") * 0.5 - 1).reshape(2, 3)),
        "layers.1.bias": ("F32", np.array([1e-3, -2.5], dtype="<f4")),
        "counts": ("I64", np.array([-1, 0, 2**40], dtype="<i8")),
        "half": ("F16", np.array([[0.5, 1.0], [1.5, -2.0]], dtype="<f2")),
        "mask": ("U8", np.array([0, 1, 255], dtype="<u1")),
    }
    header = {"__metadata__": {"written_by": "numpy", "step": "12"}}
    chunks = []
    offset = 0
    for name, (dtype, arr) in arrays.items():
        raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


if __name__ == "__main__":
    {"read": read, "write": write}[sys.argv[1]](sys.argv[2])
