#!/usr/bin/env python3
"""Writes the reference files tests/c/test_io.c reads from tests/data/: files produced by numpy (and,
for .safetensors, by a writer that follows the format's specification), so the C readers are checked
against an independent producer and not only against their own writers.

  fortran_f32.npy        np.asfortranarray(arange(12, float32).reshape(3, 4)), fortran_order True
  v2_i16.npy             arange(-3, 3, int16), written with format version 2.0
  v3_u8.npy              arange(7, uint8).reshape(7, 1), format version 3.0
  stored.npz             savez layout (zip64 local headers), STORED:
                           attention_mask int64 [[1,1,1,0],[0,1,1,1]], cu_seqlens int32 [0,3,6]
  deflated.npz           the same members, DEFLATED (savez_compressed layout)
  multi.safetensors      a int64 [2,3] = arange(6); b float32 [4] = [0.5, -1, 2, 8];
                         m bool [3] = [1,0,1]; __metadata__ {"format": "pt"}; data section in order m, a, b

Only numpy and the standard library; fixed timestamps, so the output is reproducible.
Run from anywhere:  python3 tools/make_test_data.py
"""
import io
import json
import os
import struct
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data")


def save(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def npy(arr, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr, allow_pickle=False)
    else:
        np.lib.format.write_array(buf, arr, version=version, allow_pickle=False)
    return buf.getvalue()


def npz(arrays, method):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=method) as zf:
        for name, arr in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, arr, allow_pickle=False)
    data = out.getvalue()
    with np.load(io.BytesIO(data)) as z:  # numpy reads it back unchanged
        for name, arr in arrays.items():
            assert np.array_equal(z[name], arr)
    return data


def safetensors(entries, metadata):
    """entries: (name, dtype, shape, bytes) in data order; the header lists them in another order."""
    header = {"__metadata__": metadata}
    offsets, off = {}, 0
    for name, dt, shape, raw in entries:
        offsets[name] = (dt, shape, off, off + len(raw))
        off += len(raw)
    for name in sorted(offsets):
        dt, shape, b, e = offsets[name]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [b, e]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, _, raw in entries)


def main():
    os.makedirs(OUT, exist_ok=True)
    f = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    data = npy(f)
    assert b"'fortran_order': True" in data
    save("fortran_f32.npy", data)
    save("v2_i16.npy", npy(np.arange(-3, 3, dtype=np.int16), version=(2, 0)))
    save("v3_u8.npy", npy(np.arange(7, dtype=np.uint8).reshape(7, 1), version=(3, 0)))
    batch = {
        "attention_mask": np.array([[1, 1, 1, 0], [0, 1, 1, 1]], dtype=np.int64),
        "cu_seqlens": np.array([0, 3, 6], dtype=np.int32),
    }
    save("stored.npz", npz(batch, zipfile.ZIP_STORED))
    save("deflated.npz", npz(batch, zipfile.ZIP_DEFLATED))
    save("multi.safetensors", safetensors([
        ("m", "BOOL", (3,), bytes([1, 0, 1])),
        ("a", "I64", (2, 3), np.arange(6, dtype="<i8").tobytes()),
        ("b", "F32", (4,), np.array([0.5, -1, 2, 8], dtype="<f4").tobytes()),
    ], {"format": "pt"}))
    print("wrote tests/data/{fortran_f32.npy, v2_i16.npy, v3_u8.npy, stored.npz, deflated.npz, multi.safetensors}")


if __name__ == "__main__":
    main()
