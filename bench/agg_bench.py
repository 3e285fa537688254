"""Flower-style aggregation peer for agg_bench: the weighted average exactly as Flower's
`flwr.server.strategy.aggregate.aggregate` computes it (every result in memory, each multiplied
by its example count, reduced with np.add, divided by the total), timed over --updates updates of
--params float32 parameters. Prints one JSON line."""
import argparse
import json
import time
from functools import reduce

import numpy as np


def aggregate(results):
    """Flower's aggregate(results: List[Tuple[NDArrays, int]]) -> NDArrays."""
    num_examples_total = sum(num_examples for (_, num_examples) in results)
    weighted_weights = [[layer * num_examples for layer in weights] for weights, num_examples in results]
    weights_prime = [
        reduce(np.add, layer_updates) / num_examples_total for layer_updates in zip(*weighted_weights)
    ]
    return weights_prime


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--params", type=int, required=True)
    p.add_argument("--updates", type=int, default=3)
    a = p.parse_args()
    rng = np.random.default_rng(1)
    base = rng.standard_normal(a.params, dtype=np.float32) * np.float32(1e-3)
    # Distinct arrays per client, as deserialized results would be.
    results = [([base + np.float32(k)], 1 + k % 3) for k in range(a.updates)]
    t0 = time.perf_counter()
    out = aggregate(results)
    seconds = time.perf_counter() - t0
    assert out[0].shape == (a.params,)
    nbytes = a.params * 4
    print(json.dumps({
        "updates": a.updates,
        "update_mb": nbytes / 1e6,
        "seconds": seconds,
        "input_gbps": nbytes * a.updates / seconds / 1e9,
        "numpy": np.__version__,
    }))


if __name__ == "__main__":
    main()
