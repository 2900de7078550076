"""Cross-checks maskpack's zip64 .npz writer with an independent reader, Python's zipfile.

Runs `test_io --write-zip64 PATH` (the writer with its zip64 threshold lowered to 200 bytes, so
the zip64 local and central extra fields and the zip64 end record all appear in a small file),
then opens PATH with zipfile, which rejects malformed zip64 records and checks every CRC-32, and
checks the members' names, sizes and .npy contents. Uses only the standard library.
    python3 tests/c/check_zip64.py build/tests/c/test_io
"""
import ast
import os
import subprocess
import sys
import tempfile
import zipfile


def npy_body(raw):
    """(bytes of a version 1.0 .npy) -> (header dict, data bytes)."""
    assert raw[:6] == b"\x93NUMPY", raw[:6]
    assert raw[6] == 1, raw[6]
    hlen = int.from_bytes(raw[8:10], "little")
    return ast.literal_eval(raw[10:10 + hlen].decode("latin1")), raw[10 + hlen:]


def main():
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "zip64.npz")
        subprocess.run([exe, "--write-zip64", path], check=True)
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            assert [i.filename for i in infos] == ["attention_mask.npy", "cu_seqlens.npy", "big.npy"], infos
            # later members sit past the lowered threshold: their offsets came from zip64 fields
            assert infos[2].header_offset > 200, infos[2].header_offset
            assert z.testzip() is None  # every member's CRC-32
            mask_h, mask = npy_body(z.read("attention_mask.npy"))
            cu_h, cu = npy_body(z.read("cu_seqlens.npy"))
            big_h, big = npy_body(z.read("big.npy"))
    assert mask_h["shape"] == (2, 3) and mask_h["descr"] == "<i8", mask_h
    assert [int.from_bytes(mask[8 * i:8 * i + 8], "little") for i in range(6)] == [1, 1, 0, 1, 1, 0]
    assert cu_h["shape"] == (3,) and cu_h["descr"] == "<i4", cu_h
    assert [int.from_bytes(cu[4 * i:4 * i + 4], "little") for i in range(3)] == [0, 2, 6]
    assert big_h["shape"] == (5000,) and big_h["descr"] == "|b1", big_h
    assert big == bytes(int(i % 7 == 0) for i in range(5000))
    print("zipfile read the zip64 archive: 3 members, CRCs, sizes and contents agree")


if __name__ == "__main__":
    main()
