"""A PyTorch program joins a starling federation through the exec trainer.

The client (`starling client`, or the simulated ones of `starling aggregator --simulate`) keeps
the TLS connection, scheduling, compression, error feedback and crash-safe state; each round it
starts this script, which loads the global weights, trains its own model on the device's own
data for round.json's local_steps, and writes the new weights and its metrics. With
STARLING_MODE=evaluate (the aggregator's model.eval_command) it reports test loss and accuracy.

Data: the IDX files of the folder round.json's data_path names ([data] path of the config):
train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz] for training (this client keeps
every num_partitions-th example, from its partition on, as a stand-in for a device's own
photos), t10k-* for evaluation.
"""

import gzip
import os
import struct
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "exec_protocol"))
import starling_exec as se  # noqa: E402


class Net(nn.Module):
    """McMahan et al.'s MNIST 2NN, smaller: 784 - hidden - 10."""

    def __init__(self, hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def read_idx(folder, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                data = f.read()
            magic, count = struct.unpack(">II", data[:8])
            if magic == 2051:
                return torch.frombuffer(bytearray(data[16:]), dtype=torch.uint8).reshape(count, 784)
            return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).to(torch.int64)
    raise SystemExit(f"train.py: no {stem}[.gz] in {folder}")


def load_split(folder, split):
    images = read_idx(folder, f"{split}-images-idx3-ubyte").float() / 255.0
    labels = read_idx(folder, f"{split}-labels-idx1-ubyte")
    return images, labels


def state_from(tensors):
    return {name: torch.tensor(values, dtype=torch.float32).reshape(shape)
            for name, (shape, values) in tensors.items()}


def main():
    rnd = se.round_info()
    torch.manual_seed(rnd.get("seed", 0) % (2**63))
    state = state_from(se.read_global())
    hidden = state["fc1.weight"].shape[0]
    model = Net(hidden)
    model.load_state_dict(state)  # strict: the federation's tensors are this model's
    folder = rnd["data_path"] or os.environ.get("STARLING_EXAMPLE_DATA", "")
    loss_fn = nn.CrossEntropyLoss()
    if se.mode() == "evaluate":
        images, labels = load_split(folder, "t10k")
        with torch.no_grad():
            logits = model(images)
            loss = loss_fn(logits, labels).item()
            accuracy = (logits.argmax(1) == labels).float().mean().item()
        se.write_metrics(loss=loss, accuracy=accuracy)
        return
    images, labels = load_split(folder, "train")
    mine = slice(rnd["partition"], None, max(1, rnd["num_partitions"]))
    images, labels = images[mine], labels[mine]
    opt = torch.optim.SGD(model.parameters(), lr=rnd["learning_rate"])
    batch = max(1, min(rnd["batch_size"], len(labels)))
    total = 0.0
    steps = max(1, rnd["local_steps"])
    for _ in range(steps):
        idx = torch.randint(0, len(labels), (batch,))
        opt.zero_grad()
        loss = loss_fn(model(images[idx]), labels[idx])
        loss.backward()
        opt.step()
        total += loss.item()
    se.write_output({name: (list(t.shape), t.detach().reshape(-1).tolist())
                     for name, t in model.state_dict().items()})
    se.write_metrics(num_samples=int(len(labels)), loss=total / steps)


if __name__ == "__main__":
    main()
