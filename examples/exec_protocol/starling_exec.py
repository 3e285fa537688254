"""The starling exec-trainer protocol (docs/own_model.md), in the Python standard library only.

A round's program is started by the client with these in its environment:
  STARLING_MODE        "train" or "evaluate"
  STARLING_GLOBAL      global.safetensors: the federation's model, f32
  STARLING_ROUND_JSON  round.json: round, local_steps, batch_size, learning_rate, seed, node_id,
                       partition, num_partitions, data_path, deadline_unix_ms
  STARLING_OUTPUT      where "train" writes the new weights (or, with delta=True, the update)
  STARLING_METRICS     where it writes {"num_samples": N, "loss": x} ("evaluate": loss, accuracy)

    import starling_exec as se
    rnd = se.round_info()
    tensors = se.read_global()            # {name: (shape, [floats])}
    ... train ...
    se.write_output(tensors)              # same names and shapes
    se.write_metrics(num_samples=n, loss=l)
"""

import array
import json
import os
import struct
import sys

_DTYPES = {"F32": ("f", 4), "F64": ("d", 8)}


def read_safetensors(path):
    """{name: (shape, array of floats)} in file order, and the metadata dict."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n :]
    out = {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        code, size = _DTYPES[info["dtype"]]
        a, b = info["data_offsets"]
        values = array.array(code)
        values.frombytes(body[a:b])
        if sys.byteorder != "little":
            values.byteswap()
        out[name] = (list(info["shape"]), values)
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (shape, iterable of floats)}, written as F32; atomically (rename)."""
    header = {}
    blobs = []
    offset = 0
    for name, (shape, values) in tensors.items():
        blob = array.array("f", values)
        if sys.byteorder != "little":
            blob.byteswap()
        raw = blob.tobytes()
        count = 1
        for d in shape:
            count *= d
        if len(blob) != count:
            raise ValueError(f"{name}: {len(blob)} values for shape {shape}")
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


def round_info():
    with open(os.environ["STARLING_ROUND_JSON"]) as f:
        return json.load(f)


def mode():
    return os.environ.get("STARLING_MODE", "train")


def read_global():
    return read_safetensors(os.environ["STARLING_GLOBAL"])[0]


def write_output(tensors, delta=False):
    write_safetensors(os.environ["STARLING_OUTPUT"], tensors,
                      {"starling.content": "delta" if delta else "weights"})


def write_metrics(**metrics):
    path = os.environ["STARLING_METRICS"]
    with open(path + ".tmp", "w") as f:
        json.dump(metrics, f)
    os.replace(path + ".tmp", path)
