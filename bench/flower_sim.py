"""The MNIST 2NN federation of bench/flower_sim.sh in Flower's Ray simulation.

McMahan et al.'s setting, as configs/sim_mnist_100.toml runs it in starling: N clients with an
IID partition of the MNIST training set, K clients per round, E local epochs of minibatch SGD
(batch B, learning rate lr) on a 784-200-200-10 ReLU MLP, FedAvg weighted by examples, the
global model evaluated on the 10,000 test images after the last round. Prints one JSON line:
wall time, peak memory of the whole process tree (the driver and every Ray process, sampled
every 50 ms), final test accuracy.
"""
import argparse
import gzip
import json
import os
import threading
import time

import numpy as np
import psutil


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(magic & 0xFF)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


class TreeMemory:
    """Peaks of the summed RSS and PSS of this process and all its descendants. RSS counts the
    pages the Ray workers share (libraries, torch) once per process; PSS splits them, so the
    PSS sum is what the tree really holds."""

    def __init__(self):
        self.peak = 0
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        me = psutil.Process(os.getpid())
        while not self._stop.is_set():
            total = pss = 0
            for p in [me] + me.children(recursive=True):
                try:
                    info = p.memory_full_info()
                    total += info.rss
                    pss += info.pss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self.peak_pss = max(self.peak_pss, pss)
            time.sleep(0.1)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.peak, self.peak_pss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--cpus", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    mem = TreeMemory()
    t0 = time.time()
    import flwr as fl
    import torch
    from flwr.common import ndarrays_to_parameters

    torch.set_num_threads(1)
    train_x = read_idx(os.path.join(args.data_dir, "mnist/train-images-idx3-ubyte.gz"))
    train_y = read_idx(os.path.join(args.data_dir, "mnist/train-labels-idx1-ubyte.gz"))
    test_x = read_idx(os.path.join(args.data_dir, "mnist/t10k-images-idx3-ubyte.gz"))
    test_y = read_idx(os.path.join(args.data_dir, "mnist/t10k-labels-idx1-ubyte.gz"))
    train_x = torch.tensor(train_x.reshape(-1, 784), dtype=torch.float32) / 255.0
    train_y = torch.tensor(train_y, dtype=torch.int64)
    test_x = torch.tensor(test_x.reshape(-1, 784), dtype=torch.float32) / 255.0
    test_y = torch.tensor(test_y, dtype=torch.int64)
    parts = np.array_split(np.random.default_rng(args.seed).permutation(len(train_y)), args.clients)

    def make_model():
        return torch.nn.Sequential(torch.nn.Linear(784, 200), torch.nn.ReLU(),
                                   torch.nn.Linear(200, 200), torch.nn.ReLU(),
                                   torch.nn.Linear(200, 10))

    def get_weights(model):
        return [p.detach().numpy().copy() for p in model.parameters()]

    def set_weights(model, weights):
        with torch.no_grad():
            for p, w in zip(model.parameters(), weights):
                p.copy_(torch.from_numpy(w))

    class MnistClient(fl.client.NumPyClient):
        def __init__(self, cid):
            self.idx = torch.from_numpy(parts[cid])
            self.cid = cid

        def fit(self, parameters, config):
            torch.set_num_threads(1)
            model = make_model()
            set_weights(model, parameters)
            opt = torch.optim.SGD(model.parameters(), lr=args.lr)
            g = torch.Generator().manual_seed(args.seed * 100003 + self.cid * 101 + int(config.get("round", 0)))
            for _ in range(args.epochs):
                order = self.idx[torch.randperm(len(self.idx), generator=g)]
                for s in range(0, len(order), args.batch):
                    b = order[s:s + args.batch]
                    opt.zero_grad()
                    loss = torch.nn.functional.cross_entropy(model(train_x[b]), train_y[b])
                    loss.backward()
                    opt.step()
            return get_weights(model), len(self.idx), {}

    def client_fn(context):
        return MnistClient(int(context.node_config["partition-id"])).to_client()

    final = {}

    def evaluate(server_round, parameters, config):
        if server_round != args.rounds:
            return None
        model = make_model()
        set_weights(model, parameters)
        with torch.no_grad():
            logits = model(test_x)
            loss = torch.nn.functional.cross_entropy(logits, test_y).item()
            acc = (logits.argmax(1) == test_y).float().mean().item()
        final.update(loss=loss, accuracy=acc)
        return loss, {"accuracy": acc}

    torch.manual_seed(args.seed)
    strategy = fl.server.strategy.FedAvg(
        fraction_fit=0.0, min_fit_clients=args.per_round, min_available_clients=args.clients,
        fraction_evaluate=0.0, min_evaluate_clients=0, evaluate_fn=evaluate,
        on_fit_config_fn=lambda r: {"round": r},
        initial_parameters=ndarrays_to_parameters(get_weights(make_model())))
    fl.simulation.start_simulation(
        client_fn=client_fn, num_clients=args.clients,
        config=fl.server.ServerConfig(num_rounds=args.rounds), strategy=strategy,
        client_resources={"num_cpus": 1},
        ray_init_args={"num_cpus": args.cpus, "include_dashboard": False,
                       "log_to_driver": False})
    wall = time.time() - t0
    peak, peak_pss = mem.stop()
    print(json.dumps({"engine": "flower " + fl.__version__ + " (ray, torch " + torch.__version__ + ")",
                      "wall_seconds": wall, "peak_rss_bytes": peak, "peak_pss_bytes": peak_pss,
                      "test_accuracy": final.get("accuracy", float("nan"))}))


if __name__ == "__main__":
    main()
