"""PyTorch peer of bench/sample_bench.cc's GPT rows: eager nanoGPT-style generate (crop to
block_size, forward the whole context, lm_head on the last position, softmax, multinomial; no
cache, as nanoGPT's `generate`) and the same loop with a per-layer KV cache (prefill the prompt,
then one row per token; preallocated (B, H, T, D) key/value buffers, scaled_dot_product_attention
over the filled rows). Random weights (N(0, 0.02)), a 1-token prompt, float32 on the CPU.
Prints one JSON line per mode."""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(c, bias=False)
        self.c_attn = nn.Linear(c, 3 * c, bias=False)
        self.c_proj = nn.Linear(c, c, bias=False)
        self.ln_2 = nn.LayerNorm(c, bias=False)
        self.c_fc = nn.Linear(c, 4 * c, bias=False)
        self.mlp_proj = nn.Linear(4 * c, c, bias=False)

    def forward(self, x, cache=None, pos=0):
        b, t, c = x.shape
        d = c // self.h
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q = q.view(b, t, self.h, d).transpose(1, 2)
        k = k.view(b, t, self.h, d).transpose(1, 2)
        v = v.view(b, t, self.h, d).transpose(1, 2)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            kc, vc = cache
            kc[:, :, pos:pos + t] = k
            vc[:, :, pos:pos + t] = v
            # A prefill from position 0 is causal; one new row sees every cached row.
            y = F.scaled_dot_product_attention(q, kc[:, :, :pos + t], vc[:, :, :pos + t],
                                               is_causal=t > 1)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, v, t, l, h, c):
        super().__init__()
        self.block_size = t
        self.wte = nn.Embedding(v, c)
        self.wpe = nn.Embedding(t, c)
        self.blocks = nn.ModuleList([Block(c, h) for _ in range(l)])
        self.ln_f = nn.LayerNorm(c, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def last_logits(self, idx, caches=None, pos=0):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(pos, pos + t))
        for i, blk in enumerate(self.blocks):
            x = blk(x, None if caches is None else caches[i], pos)
        return self.ln_f(x[:, -1, :]) @ self.wte.weight.t()

    @torch.no_grad()
    def generate(self, idx, max_new, temperature=1.0, kv=False):
        caches, filled = None, 0
        if kv:
            c = self.wte.weight.shape[1]
            h = self.blocks[0].h
            shape = (idx.shape[0], h, self.block_size, c // h)
            caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in self.blocks]
        for _ in range(max_new):
            n = idx.shape[1]
            if kv and n <= self.block_size:
                logits = self.last_logits(idx[:, filled:], caches, filled)
                filled = n
            else:
                logits = self.last_logits(idx[:, -self.block_size:])
            probs = F.softmax(logits / temperature, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
        return idx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=65)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--embd", type=int, default=384)
    ap.add_argument("--new", type=int, default=255)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--modes", default="kv,nocache")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    model = GPT(args.vocab, args.block, args.layers, args.heads, args.embd).eval()
    what = (f"gpt L{args.layers} H{args.heads} C{args.embd} T{args.block} V{args.vocab}")
    for mode in args.modes.split(","):  # warm up (first-call allocations, kernel selection)
        model.generate(torch.zeros((1, 1), dtype=torch.long), 4, kv=mode == "kv")
    outs = {}
    for mode in args.modes.split(","):
        torch.manual_seed(7)
        t0 = time.perf_counter()
        outs[mode] = model.generate(torch.zeros((1, 1), dtype=torch.long), args.new,
                                    kv=mode == "kv")
        secs = time.perf_counter() - t0
        print(json.dumps({"engine": "pytorch eager " + torch.__version__, "what": what,
                          "mode": "kv cache" if mode == "kv" else "no cache",
                          "threads": torch.get_num_threads(), "tokens": args.new,
                          "seconds": round(secs, 4), "tokens_per_s": round(args.new / secs, 2)}),
              flush=True)
    if len(outs) == 2:
        a, b = outs.values()
        # Float summation differs between the two paths, so the draws may part ways.
        print(json.dumps({"same_ids": bool(torch.equal(a, b))}), flush=True)


if __name__ == "__main__":
    main()
