#!/usr/bin/env python3
"""Cuts the small data folder tests/fixtures/data from the real datasets.

    python3 scripts/make_fixture_data.py [DATA_DIR] [--out tests/fixtures/data]

DATA_DIR (default ../shared/data, the layout of shared/data/README.md) holds the original
MNIST and Fashion-MNIST IDX files (gzip), tinyshakespeare/input.txt and GPT-2's BPE files. The fixture keeps the
first N images and labels of each IDX file (same header, count rewritten), gzipped with mtime 0
and no file name so the output is byte-for-byte deterministic, and copies input.txt unchanged.
CI runs every shipped config against it (scripts/config_smoke.sh); see its README.md.
Standard library only.
"""

import argparse
import gzip
import hashlib
import os
import shutil
import struct
import sys

# (dataset folder, split file prefix, number of examples kept).
CUTS = [
    ("mnist", "train", 3000),
    ("mnist", "t10k", 500),
    ("fashion-mnist", "train", 1000),
    ("fashion-mnist", "t10k", 200),
]


def read_idx(path):
    with gzip.open(path, "rb") as f:
        return f.read()


def cut_images(raw, n, path):
    magic, count, rows, cols = struct.unpack(">IIII", raw[:16])
    if magic != 0x803:
        sys.exit(f"{path}: not an IDX3 ubyte file (magic {magic:#x})")
    if count < n:
        sys.exit(f"{path}: holds {count} images, fewer than the {n} wanted")
    px = rows * cols
    if len(raw) != 16 + count * px:
        sys.exit(f"{path}: header says {count} x {rows} x {cols}, file has {len(raw) - 16} bytes")
    return struct.pack(">IIII", magic, n, rows, cols) + raw[16:16 + n * px]


def cut_labels(raw, n, path):
    magic, count = struct.unpack(">II", raw[:8])
    if magic != 0x801:
        sys.exit(f"{path}: not an IDX1 ubyte file (magic {magic:#x})")
    if count < n or len(raw) != 8 + count:
        sys.exit(f"{path}: {count} labels in {len(raw) - 8} bytes, {n} wanted")
    return struct.pack(">II", magic, n) + raw[8:8 + n]


def write_gz(path, data):
    # gzip.GzipFile with filename="" and mtime=0: no name, no time in the header.
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as f:
            f.write(data)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


WIKI_ARTICLES = 8


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", nargs="?", default=os.path.join(repo, "..", "shared", "data"),
                    help="the real data folder (default: ../shared/data beside the checkout)")
    ap.add_argument("--out", default=os.path.join(repo, "tests", "fixtures", "data"),
                    help="fixture folder to write (default: tests/fixtures/data)")
    args = ap.parse_args()

    written = []
    for dataset, split, n in CUTS:
        src_dir = os.path.join(args.data_dir, dataset)
        dst_dir = os.path.join(args.out, dataset)
        os.makedirs(dst_dir, exist_ok=True)
        img_name = f"{split}-images-idx3-ubyte.gz"
        lab_name = f"{split}-labels-idx1-ubyte.gz"
        img_src = os.path.join(src_dir, img_name)
        lab_src = os.path.join(src_dir, lab_name)
        images = cut_images(read_idx(img_src), n, img_src)
        labels = cut_labels(read_idx(lab_src), n, lab_src)
        for name, data in ((img_name, images), (lab_name, labels)):
            dst = os.path.join(dst_dir, name)
            write_gz(dst, data)
            written.append(f"{dataset}/{name}")
        counts = [0] * 10
        for b in labels[8:]:
            counts[b] += 1
        print(f"{dataset}/{split}: first {n} examples, labels per class {counts}")

    text_dst = os.path.join(args.out, "tinyshakespeare")
    os.makedirs(text_dst, exist_ok=True)
    shutil.copyfile(os.path.join(args.data_dir, "tinyshakespeare", "input.txt"),
                    os.path.join(text_dst, "input.txt"))
    written.append("tinyshakespeare/input.txt")

    bpe_dst = os.path.join(args.out, "gpt2")
    os.makedirs(bpe_dst, exist_ok=True)
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copyfile(os.path.join(args.data_dir, "gpt2", name), os.path.join(bpe_dst, name))
        written.append("gpt2/" + name)

    # WikiText-2 test: its first WIKI_ARTICLES articles, whole lines, bytes unchanged (the article
    # partition of configs/fed_gpt2_lora_wiki.toml gets one client per article).
    with open(os.path.join(args.data_dir, "wikitext-2", "wiki.test.tokens"), "rb") as f:
        wiki = f.read()
    kept, titles = [], 0
    for line in wiki.split(b"\n")[:-1]:
        s = line.strip(b" \r")
        title = (len(s) >= 5 and s.startswith(b"= ") and s.endswith(b" =")
                 and s[2:3] != b"=" and s[-3:-2] != b"=")
        if title:
            titles += 1
            if titles > WIKI_ARTICLES:
                break
        kept.append(line + b"\n")
    wiki_dst = os.path.join(args.out, "wikitext-2")
    os.makedirs(wiki_dst, exist_ok=True)
    with open(os.path.join(wiki_dst, "wiki.test.tokens"), "wb") as f:
        f.write(b"".join(kept))
    written.append("wikitext-2/wiki.test.tokens")
    print(f"wikitext-2/wiki.test.tokens: first {WIKI_ARTICLES} articles")

    total = 0
    for rel in written:
        path = os.path.join(args.out, rel)
        size = os.path.getsize(path)
        total += size
        print(f"{sha256(path)}  {rel}  ({size} bytes)")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
