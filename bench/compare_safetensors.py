#!/usr/bin/env python3
"""Compares the float32 tensors of two safetensors files (standard library only): prints the
largest absolute difference over the largest absolute value of the first file (the normalized
error), per file and for the worst tensor; exits 1 when it exceeds --tol or the tensors differ
in names or shapes.

    python3 bench/compare_safetensors.py A.safetensors B.safetensors [--tol 1e-4]
"""
import argparse
import json
import struct
import sys
from array import array


def load(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor {name} is {info['dtype']}, not F32")
        begin, end = info["data_offsets"]
        values = array("f")
        values.frombytes(data[begin:end])
        if sys.byteorder != "little":
            values.byteswap()
        out[name] = (tuple(info["shape"]), values)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    a, b = load(args.a), load(args.b)
    if sorted(a) != sorted(b):
        print(f"tensor names differ: {sorted(set(a) ^ set(b))}")
        return 1
    err, scale, worst, worst_err = 0.0, 1e-30, "", 0.0
    for name in sorted(a):
        (sa, va), (sb, vb) = a[name], b[name]
        if sa != sb:
            print(f"{name}: shape {sa} vs {sb}")
            return 1
        e = max((abs(x - y) for x, y in zip(va, vb)), default=0.0)
        scale = max(scale, max((abs(x) for x in va), default=0.0))
        if e >= worst_err:
            worst, worst_err = name, e
        err = max(err, e)
    normalized = err / scale
    ok = normalized <= args.tol
    print(f"normalized error {normalized:.3e} (max |diff| {err:.3e} in {worst}, max |value| "
          f"{scale:.3e}) over {len(a)} tensors: {'within' if ok else 'ABOVE'} {args.tol:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
