"""A Flower client (Python + PyTorch) doing one edge client's work, for bench/client_footprint.sh.

The same task as `starling client` in that script: MNIST, the 2NN (784-200-200-10) or McMahan's
CNN, one client's IID partition (data.num_clients = 100: 600 examples), E=1, B=10, lr 0.1, R
rounds. The client's fit() is called the way Flower's client app calls it, without the gRPC
server (which would only add to Flower's figures). Prints peak RSS (MiB) and seconds per round.
"""
import argparse
import gzip
import resource
import struct
import time
from pathlib import Path

import flwr as fl
import numpy as np
import torch
from torch import nn


def load_idx(path: Path) -> np.ndarray:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(data_dir: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem):
        p = data_dir / "mnist" / name
        if p.exists():
            return p
    raise FileNotFoundError(f"{stem} not under {data_dir}/mnist")


def model_of(kind: str) -> nn.Module:
    if kind == "cnn":
        return nn.Sequential(
            nn.Unflatten(1, (1, 28, 28)),
            nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 10))
    return nn.Sequential(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
                         nn.Linear(200, 10))


class MnistClient(fl.client.NumPyClient):
    def __init__(self, model, x, y):
        self.model, self.x, self.y = model, x, y

    def get_parameters(self, config):
        return [p.detach().numpy().copy() for p in self.model.parameters()]

    def fit(self, parameters, config):
        with torch.no_grad():
            for p, v in zip(self.model.parameters(), parameters):
                p.copy_(torch.from_numpy(v))
        opt = torch.optim.SGD(self.model.parameters(), lr=config["lr"])
        perm = torch.randperm(len(self.y))
        for i in range(0, len(self.y), config["batch_size"]):
            idx = perm[i : i + config["batch_size"]]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx])
            loss.backward()
            opt.step()
        return self.get_parameters(config), len(self.y), {"loss": float(loss)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--model", choices=["2nn", "cnn"], default="2nn")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partition", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    data_dir = Path(a.data_dir)
    images = load_idx(find(data_dir, "train-images-idx3-ubyte"))
    labels = load_idx(find(data_dir, "train-labels-idx1-ubyte"))
    # One IID partition of 100, like data.partition = "IID" (the client keeps only its own).
    rng = np.random.default_rng(1)
    mine = rng.permutation(len(labels))[a.partition * 600 : (a.partition + 1) * 600]
    x = torch.from_numpy(images[mine].reshape(-1, 784).astype(np.float32) / 255.0)
    y = torch.from_numpy(labels[mine].astype(np.int64))
    del images, labels
    model = model_of(a.model)
    client = MnistClient(model, x, y)
    params = client.get_parameters({})
    t0 = time.perf_counter()
    for _ in range(a.rounds):
        params, _, _ = client.fit(params, {"lr": 0.1, "batch_size": 10})
    per_round = (time.perf_counter() - t0) / a.rounds
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"flower {a.model} peak_rss_mib {peak_mib:.1f} seconds_per_round {per_round:.3f}")


if __name__ == "__main__":
    main()
