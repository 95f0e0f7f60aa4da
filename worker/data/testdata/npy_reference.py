"""Writes the .npy and .bin files the dataset reader test reads back.

The values are simple formulas that the C++ test evaluates too, so the
reader is checked against NumPy's own writer (numpy.save and
numpy.lib.format.write_array, format versions 1.0, 2.0 and 3.0) and
ndarray.tofile as nanoGPT's prepare.py uses it. Usage: npy_reference.py DIR
"""
import os
import sys

import numpy as np


def save(directory, name, array, version=None):
    with open(os.path.join(directory, name), "wb") as f:
        if version is None:
            np.save(f, array)
        else:
            np.lib.format.write_array(f, array, version=version)


def main():
    d = sys.argv[1]
    # float32 features [5, 2, 3]: element i is float32(i * 0.37 - 5).
    features = (np.arange(30) * 0.37 - 5).astype(np.float32).reshape(5, 2, 3)
    save(d, "f32.npy", features)
    save(d, "f32_v2.npy", features, version=(2, 0))
    save(d, "f32_v3.npy", features, version=(3, 0))
    # uint8 features [5, 4]: element i is (i * 37) % 256.
    save(d, "u8.npy", ((np.arange(20) * 37) % 256).astype(np.uint8).reshape(5, 4))
    labels = np.array([0, 2, 1, 2, 0])
    for dtype in ("uint8", "int32", "int64"):
        save(d, "labels_%s.npy" % dtype, labels.astype(dtype))
    save(d, "labels_out_of_range.npy", np.array([0, 2, 1, 3, 0], np.int64))
    save(d, "labels_negative.npy", np.array([0, 2, -1, 2, 0], np.int32))
    save(d, "labels_short.npy", labels[:4].astype(np.int64))
    save(d, "labels_float.npy", labels.astype(np.float32))
    save(d, "f64.npy", features.astype(np.float64))
    save(d, "fortran.npy", np.asfortranarray(features.reshape(5, 6)))
    save(d, "big_endian.npy", features.astype(">f4"))
    with open(os.path.join(d, "f32.npy"), "rb") as f:
        whole = f.read()
    with open(os.path.join(d, "truncated.npy"), "wb") as f:
        f.write(whole[:-3])
    # Token shards: id i is (i * 7) % 11, 40 of them.
    tokens = (np.arange(40) * 7) % 11
    tokens.astype(np.uint16).tofile(os.path.join(d, "tokens.bin"))
    save(d, "tokens_i32.npy", tokens.astype(np.int32))
    bad = tokens.astype(np.uint16)
    bad[17] = 11
    bad.tofile(os.path.join(d, "tokens_bad.bin"))
    with open(os.path.join(d, "odd.bin"), "wb") as f:
        f.write(b"\x01\x00\x02")
    save(d, "tokens_2d.npy", tokens.astype(np.int32).reshape(4, 10))


if __name__ == "__main__":
    main()
