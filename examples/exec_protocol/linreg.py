"""A trainer of the exec protocol with no dependencies: linear regression y = w.x + b.

Each partition draws its own examples (seeded by the partition) of a fixed true model
w* = (1, -2, 3, 0.5), b* = -1 with a little noise, and runs round.json's local_steps of
minibatch SGD. "evaluate" mode reports the mean squared error on held-out examples.
The tests drive it through `starling aggregator --simulate` and `starling client`; it also
fails on purpose when STARLING_TEST_FAIL says so ("crash@R:P", "hang@R:P", "badshape@R:P",
"nan@R:P": in round R on partition P), to show that such a failure costs that round only.
"""

import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import starling_exec as se  # noqa: E402

W_TRUE = [1.0, -2.0, 3.0, 0.5]
B_TRUE = -1.0


def examples(seed, n):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        x = [rng.uniform(-1, 1) for _ in W_TRUE]
        y = sum(a * b for a, b in zip(W_TRUE, x)) + B_TRUE + rng.gauss(0, 0.05)
        out.append((x, y))
    return out


def mse(w, b, data):
    return sum((sum(a * c for a, c in zip(w, x)) + b - y) ** 2 for x, y in data) / len(data)


def main():
    rnd = se.round_info()
    tensors = se.read_global()
    w = list(tensors["linear.weight"][1])
    b = tensors["linear.bias"][1][0]
    if se.mode() == "evaluate":
        test = examples(10_000, 200)
        se.write_metrics(loss=mse(w, b, test))
        return
    fail = os.environ.get("STARLING_TEST_FAIL", "")
    if fail:
        kind, _, where = fail.partition("@")
        r, _, p = where.partition(":")
        if int(r) == rnd["round"] and int(p) == rnd["partition"]:
            if kind == "crash":
                print("linreg: crashing on purpose in round", r, file=sys.stderr)
                sys.exit(3)
            if kind == "hang":
                time.sleep(3600)
            if kind == "badshape":
                se.write_output({"linear.weight": ([2, 2], w), "linear.bias": ([1], [b])})
                se.write_metrics(num_samples=1, loss=0.0)
                return
            if kind == "nan":
                w[0] = float("nan")
    data = examples(rnd["partition"] + 1, 64)
    rng = random.Random(rnd["seed"])
    lr = rnd["learning_rate"]
    steps = max(1, rnd["local_steps"])
    batch = max(1, min(rnd["batch_size"], len(data)))
    loss = 0.0
    for _ in range(steps):
        chunk = rng.sample(data, batch)
        gw = [0.0] * len(w)
        gb = 0.0
        loss = 0.0
        for x, y in chunk:
            err = sum(a * c for a, c in zip(w, x)) + b - y
            loss += err * err / batch
            for i, xi in enumerate(x):
                gw[i] += 2 * err * xi / batch
            gb += 2 * err / batch
        w = [wi - lr * g for wi, g in zip(w, gw)]
        b -= lr * gb
    se.write_output({"linear.weight": ([len(w)], w), "linear.bias": ([1], [b])})
    se.write_metrics(num_samples=len(data), loss=loss)


if __name__ == "__main__":
    main()
