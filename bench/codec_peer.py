"""codec_peer: the transforms of core/compress written in numpy and in PyTorch (CPU, one thread),
timed on a delta of the layout codec_bench passes. Prints "<spec> <lib> <encode GB/s> <decode GB/s>".
"""
import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402

try:
    import torch  # noqa: E402

    torch.set_num_threads(1)
except ImportError:
    torch = None


def parse_spec(spec):
    name, _, rest = spec.partition(":")
    params = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return name, params


def keep(n, ratio):
    return min(n, max(1, int(np.ceil(ratio * n))))


# ---------------------------------------------------------------- numpy
class Numpy:
    def __init__(self, tensors, seed=0):
        self.tensors = tensors  # [(name, shape, offset, numel)]
        self.rng = np.random.default_rng(seed)
        self.q = {}

    def blocks(self, x, b):
        pad = (-x.size) % b
        return (np.pad(x, (0, pad)) if pad else x).reshape(-1, b)

    def int8_enc(self, x, b):
        xb = self.blocks(x, b)
        amax = np.abs(xb).max(axis=1)
        inv = np.divide(127.0, amax, out=np.zeros_like(amax), where=amax > 0)
        return np.rint(xb * inv[:, None]).astype(np.int8), amax / 127.0

    def int8_dec(self, enc, n):
        q, scale = enc
        return (q * scale[:, None]).reshape(-1)[:n]

    def encode(self, spec, x):
        name, p = parse_spec(spec)
        if name == "identity":
            return x.copy()
        if name == "fp16":
            return x.astype(np.float16)
        if name == "bf16":
            u = x.view(np.uint32)
            return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        if name == "int8":
            return self.int8_enc(x, int(p.get("block", 256)))
        if name == "qsgd":
            s, b = int(p.get("levels", 8)), int(p.get("bucket", 512))
            xb = self.blocks(x, b)
            norm = np.sqrt(np.einsum("ij,ij->i", xb, xb))
            inv = np.divide(s, norm, out=np.zeros_like(norm), where=norm > 0)
            r = np.abs(xb) * inv[:, None]
            lvl = np.floor(r + self.rng.random(r.shape, dtype=np.float32))
            return (np.sign(xb) * lvl).astype(np.int8), norm / s
        out = []
        for tname, shape, off, n in self.tensors:
            t = x[off : off + n]
            if name == "topk":
                k = keep(n, float(p.get("ratio", 0.01)))
                a = np.abs(t)
                if p.get("approx") == "1":
                    m = max(min(n, 256), int(np.ceil(float(p.get("sample", 0.01)) * n)))
                    smp = a[self.rng.integers(0, n, m)]
                    e = k * m / n
                    ks = min(m, max(1, int(np.ceil(e + 3 * np.sqrt(e) + 2))))
                    thr = np.partition(smp, m - ks)[m - ks]
                    idx = np.flatnonzero(a >= thr)
                    if idx.size > k:
                        idx = idx[np.argpartition(a[idx], idx.size - k)[idx.size - k :]]
                else:
                    idx = np.argpartition(a, n - k)[n - k :]
                vals = t[idx]
                if p.get("values") == "int8":
                    vals = self.int8_enc(vals, int(p.get("block", 256)))
                out.append((off, idx, vals))
            elif name == "randk":
                k = keep(n, float(p.get("ratio", 0.01)))
                starts = (np.arange(k + 1, dtype=np.int64) * n) // k
                sizes = np.diff(starts)
                idx = starts[:-1] + (self.rng.random(k) * sizes).astype(np.int64)
                out.append((off, idx, t[idx] * sizes.astype(np.float32)))
            elif name == "powersgd":
                r = int(p.get("rank", 4))
                rows = shape[0]
                cols = n // rows if len(shape) > 1 else 1
                if len(shape) < 2 or r * (rows + cols) >= n:
                    out.append((off, None, t.copy()))
                    continue
                m = t.reshape(rows, cols)
                q = self.q.get(tname)
                if q is None:
                    q = self.rng.standard_normal((cols, r), dtype=np.float32)
                pm, _ = np.linalg.qr(m @ q)
                q = m.T @ pm
                self.q[tname] = q
                out.append((off, (rows, cols), (pm, q)))
            elif name == "sign":
                out.append((off, n, (np.packbits(t < 0), np.abs(t).mean(dtype=np.float64))))
            else:
                raise ValueError(spec)
        return out

    def decode_add(self, spec, enc, dst, w):
        name, p = parse_spec(spec)
        n = dst.size
        if name == "identity":
            dst += w * enc
        elif name in ("fp16",):
            dst += w * enc.astype(np.float32)
        elif name == "bf16":
            dst += w * (enc.astype(np.uint32) << 16).view(np.float32)
        elif name in ("int8", "qsgd"):
            dst += w * self.int8_dec(enc, n)
        else:
            for off, meta, payload in enc:
                if name in ("topk", "randk"):
                    vals = payload
                    if isinstance(vals, tuple):
                        vals = self.int8_dec(vals, meta.size)
                    dst[off + meta] += w * vals
                elif name == "powersgd":
                    if meta is None:
                        dst[off : off + payload.size] += w * payload
                    else:
                        rows, cols = meta
                        pm, q = payload
                        dst[off : off + rows * cols].reshape(rows, cols)[...] += w * (pm @ q.T)
                elif name == "sign":
                    bits, scale = payload
                    neg = np.unpackbits(bits, count=meta).astype(bool)
                    dst[off : off + meta] += np.where(neg, -w * scale, w * scale).astype(np.float32)


# ---------------------------------------------------------------- torch
class Torch(Numpy):
    def __init__(self, tensors, seed=0):
        super().__init__(tensors, seed)
        self.gen = torch.Generator().manual_seed(seed)

    def blocks(self, x, b):
        pad = (-x.numel()) % b
        return (torch.nn.functional.pad(x, (0, pad)) if pad else x).view(-1, b)

    def int8_enc(self, x, b):
        xb = self.blocks(x, b)
        amax = xb.abs().amax(dim=1)
        inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
        return torch.round(xb * inv[:, None]).to(torch.int8), amax / 127.0

    def int8_dec(self, enc, n):
        q, scale = enc
        return (q * scale[:, None]).view(-1)[:n]

    def encode(self, spec, x):
        name, p = parse_spec(spec)
        if name == "identity":
            return x.clone()
        if name == "fp16":
            return x.to(torch.float16)
        if name == "bf16":
            return x.to(torch.bfloat16)
        if name == "int8":
            return self.int8_enc(x, int(p.get("block", 256)))
        if name == "qsgd":
            s, b = int(p.get("levels", 8)), int(p.get("bucket", 512))
            xb = self.blocks(x, b)
            norm = torch.linalg.vector_norm(xb, dim=1)
            inv = torch.where(norm > 0, s / norm, torch.zeros_like(norm))
            r = xb.abs() * inv[:, None]
            lvl = torch.floor(r + torch.rand(r.shape, generator=self.gen))
            return (torch.sign(xb) * lvl).to(torch.int8), norm / s
        out = []
        for tname, shape, off, n in self.tensors:
            t = x[off : off + n]
            if name == "topk":
                k = keep(n, float(p.get("ratio", 0.01)))
                a = t.abs()
                if p.get("approx") == "1":
                    m = max(min(n, 256), int(np.ceil(float(p.get("sample", 0.01)) * n)))
                    smp = a[torch.randint(0, n, (m,), generator=self.gen)]
                    e = k * m / n
                    ks = min(m, max(1, int(np.ceil(e + 3 * np.sqrt(e) + 2))))
                    thr = torch.kthvalue(smp, m - ks + 1).values
                    idx = torch.nonzero(a >= thr).view(-1)
                    if idx.numel() > k:
                        idx = idx[torch.topk(a[idx], k, sorted=False).indices]
                else:
                    idx = torch.topk(a, k, sorted=False).indices
                vals = t[idx]
                if p.get("values") == "int8":
                    vals = self.int8_enc(vals, int(p.get("block", 256)))
                out.append((off, idx, vals))
            elif name == "randk":
                k = keep(n, float(p.get("ratio", 0.01)))
                starts = (torch.arange(k + 1, dtype=torch.int64) * n) // k
                sizes = starts[1:] - starts[:-1]
                idx = starts[:-1] + (torch.rand(k, generator=self.gen, dtype=torch.float64) * sizes).long()
                out.append((off, idx, t[idx] * sizes.float()))
            elif name == "powersgd":
                r = int(p.get("rank", 4))
                rows = shape[0]
                cols = n // rows if len(shape) > 1 else 1
                if len(shape) < 2 or r * (rows + cols) >= n:
                    out.append((off, None, t.clone()))
                    continue
                m = t.view(rows, cols)
                q = self.q.get(tname)
                if q is None:
                    q = torch.randn((cols, r), generator=self.gen)
                pm, _ = torch.linalg.qr(m @ q)
                q = m.T @ pm
                self.q[tname] = q
                out.append((off, (rows, cols), (pm, q)))
            elif name == "sign":
                neg = (t < 0).view(-1)
                pad = (-n) % 8
                bits = torch.nn.functional.pad(neg, (0, pad)).view(-1, 8).to(torch.uint8)
                packed = (bits << torch.arange(8, dtype=torch.uint8)).sum(dim=1, dtype=torch.uint8)
                out.append((off, n, (packed, t.abs().mean())))
            else:
                raise ValueError(spec)
        return out

    def decode_add(self, spec, enc, dst, w):
        name, p = parse_spec(spec)
        n = dst.numel()
        if name == "identity":
            dst.add_(enc, alpha=w)
        elif name in ("fp16", "bf16"):
            dst.add_(enc.float(), alpha=w)
        elif name in ("int8", "qsgd"):
            dst.add_(self.int8_dec(enc, n), alpha=w)
        else:
            for off, meta, payload in enc:
                if name in ("topk", "randk"):
                    vals = payload
                    if isinstance(vals, tuple):
                        vals = self.int8_dec(vals, meta.numel())
                    dst.index_add_(0, meta + off, vals, alpha=w)
                elif name == "powersgd":
                    if meta is None:
                        dst[off : off + payload.numel()].add_(payload, alpha=w)
                    else:
                        rows, cols = meta
                        pm, q = payload
                        dst[off : off + rows * cols].view(rows, cols).addmm_(pm, q.T, alpha=w)
                elif name == "sign":
                    packed, scale = payload
                    bits = (packed[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1
                    neg = bits.view(-1)[:meta].bool()
                    dst[off : off + meta].add_(torch.where(neg, -scale, scale), alpha=w)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--codecs", required=True)
    args = ap.parse_args()
    tensors, off = [], 0
    with open(args.layout) as f:
        for line in f:
            parts = line.split()
            shape = tuple(int(d) for d in parts[1:])
            n = int(np.prod(shape))
            tensors.append((parts[0], shape, off, n))
            off += n
    gb = 4.0 * off / 1e9
    x = (np.random.default_rng(1234).standard_normal(off, dtype=np.float32) * 1e-3).astype(np.float32)
    libs = [("numpy", Numpy(tensors), x, np.zeros_like(x))]
    if torch is not None:
        xt = torch.from_numpy(x)
        libs.append(("torch", Torch(tensors), xt, torch.zeros_like(xt)))
    for spec in args.codecs.split(";"):
        for lib, impl, data, dst in libs:
            best_enc = best_dec = float("inf")
            for _ in range(args.reps):
                t0 = time.perf_counter()
                enc = impl.encode(spec, data)
                best_enc = min(best_enc, time.perf_counter() - t0)
                t0 = time.perf_counter()
                impl.decode_add(spec, enc, dst, 0.5)
                best_dec = min(best_dec, time.perf_counter() - t0)
            print(f"{spec} {lib} {gb / best_enc:.4f} {gb / best_dec:.4f}", flush=True)


if __name__ == "__main__":
    main()
