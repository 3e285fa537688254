#!/usr/bin/env python3
"""make_fixture.py: writes tests/fixtures/hf_gpt2_tiny, a tiny GPT-2 checkpoint produced by
Hugging Face `transformers`, for testing starling's GPT-2 importer.

Run from the repository root with the venv made by bench/hf/setup_venv.sh:

    bench/hf/.venv/bin/python bench/hf/make_fixture.py [--out tests/fixtures/hf_gpt2_tiny]
        [--data /work/shared/data/tinyshakespeare/input.txt]

What it writes into --out:
  vocab.json, merges.txt      byte-level BPE tokenizer (GPT-2 file format) trained on Tiny
                              Shakespeare with the `tokenizers` library, vocab_size 320
  tokenizer.json, tokenizer_config.json
                              the same tokenizer as saved by transformers' save_pretrained
  config.json, generation_config.json, model.safetensors
                              GPT2LMHeadModel(n_positions=32, n_embd=32, n_layer=2, n_head=4),
                              seed 0, with every LayerNorm weight/bias and every Linear/Conv1D
                              bias overwritten by random values (so none of them is 1 or 0)
  expected.safetensors        input_ids (int32, [2,16]), logits (float32, [2,16,V]),
                              logits_len7 (float32, [2,7,V]), loss (float32, [1]); logits are
                              computed in float64 from the stored float32 weights
  README.md                   provenance, versions and sha256 of every other file

The output is deterministic: running it twice gives byte-identical files.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

import torch

# Keep BLAS/thread scheduling out of the picture: the reference runs single-threaded.
torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer  # noqa: E402
from transformers.pytorch_utils import Conv1D  # noqa: E402

EOT = "<|endoftext|>"
VOCAB_SIZE = 320
SEQ = 16
SHORT = 7
ROW1_SEED = 1234
PARAM_SEED = 4321

REPO_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "fixtures", "hf_gpt2_tiny")
DEFAULT_DATA = "/work/shared/data/tinyshakespeare/input.txt"

ROUNDTRIP_SENTENCE = "Before we proceed any further, hear me speak.\nSpeak, speak; we know't!"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def train_tokenizer(data_path):
    """Trains the byte-level BPE and returns (vocab dict token->id, merges list of 'a b')."""
    tok = ByteLevelBPETokenizer()  # GPT-2 settings: no prefix space, no normalizer
    tok.train(files=[data_path], vocab_size=VOCAB_SIZE, min_frequency=2,
              special_tokens=[EOT], show_progress=False)
    state = json.loads(tok.to_str())
    vocab = state["model"]["vocab"]
    merges = state["model"]["merges"]
    # Merges are ["a", "b"] pairs in recent tokenizers and "a b" strings in older ones.
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    for m in merges:
        if len(m.split(" ")) != 2:
            raise SystemExit(f"merge {m!r} does not split into two symbols")
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise SystemExit("tokenizer vocab ids are not dense 0..N-1")
    if EOT not in vocab:
        raise SystemExit(f"{EOT} missing from the vocab")
    return vocab, merges


def write_gpt2_files(out, vocab, merges):
    """vocab.json (token -> id, in id order) and merges.txt in the GPT-2 file format."""
    ordered = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(ordered, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for m in merges:
            f.write(m + "\n")


def check_tokenizer_dir(path, expect_vocab):
    """Loads `path` with transformers' GPT-2 tokenizer and checks a Shakespeare round trip."""
    # In transformers 5 GPT2TokenizerFast is an alias of GPT2Tokenizer; check both names.
    results = []
    for cls in (GPT2Tokenizer, transformers.GPT2TokenizerFast):
        tok = cls.from_pretrained(path)
        if len(tok) != expect_vocab:
            raise SystemExit(f"{path}: tokenizer has {len(tok)} tokens, expected {expect_vocab}")
        ids = tok(ROUNDTRIP_SENTENCE)["input_ids"]
        back = tok.decode(ids)
        if back != ROUNDTRIP_SENTENCE:
            raise SystemExit(f"{path}: round trip failed: {back!r}")
        results.append((tok, ids))
    if results[0][1] != results[1][1]:
        raise SystemExit(f"{path}: GPT2Tokenizer and GPT2TokenizerFast disagree")
    return results[0]


def randomize_norms_and_biases(model):
    """Every LayerNorm weight -> 1 + 0.1*randn, every LayerNorm/Linear/Conv1D bias -> 0.05*randn."""
    gen = torch.Generator().manual_seed(PARAM_SEED)
    touched = []
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.copy_(1.0 + 0.1 * torch.randn(mod.weight.shape, generator=gen))
                mod.bias.copy_(0.05 * torch.randn(mod.bias.shape, generator=gen))
                touched += [name + ".weight", name + ".bias"]
            elif isinstance(mod, (torch.nn.Linear, Conv1D)) and mod.bias is not None:
                mod.bias.copy_(0.05 * torch.randn(mod.bias.shape, generator=gen))
                touched.append(name + ".bias")
    return touched


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--data", default=DEFAULT_DATA)
    args = ap.parse_args()
    out = args.out

    # Start from an empty directory so no stale file survives.
    if os.path.isdir(out):
        for entry in os.listdir(out):
            p = os.path.join(out, entry)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    os.makedirs(out, exist_ok=True)

    # ---- tokenizer ---------------------------------------------------------------------
    vocab, merges = train_tokenizer(args.data)
    V = len(vocab)
    eot_id = vocab[EOT]
    with tempfile.TemporaryDirectory() as tmp:
        # The bare GPT-2 files alone must be enough for transformers.
        write_gpt2_files(tmp, vocab, merges)
        hf_tok, _ = check_tokenizer_dir(tmp, V)
        hf_tok.save_pretrained(out)
    # Our own vocab.json / merges.txt are authoritative; write them after save_pretrained.
    write_gpt2_files(out, vocab, merges)
    hf_tok, rt_ids = check_tokenizer_dir(out, V)
    auto_tok = transformers.AutoTokenizer.from_pretrained(out)
    if auto_tok(ROUNDTRIP_SENTENCE)["input_ids"] != rt_ids:
        raise SystemExit("AutoTokenizer disagrees with GPT2Tokenizer")
    raw = tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    if raw.encode(ROUNDTRIP_SENTENCE).ids != rt_ids:
        raise SystemExit("tokenizer.json disagrees with vocab.json/merges.txt")
    print(f"tokenizer: vocab {V}, {len(merges)} merges, {EOT} id {eot_id}; "
          f"round trip ok ({len(rt_ids)} tokens)")

    # ---- model ---------------------------------------------------------------------------
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=eot_id, eos_token_id=eot_id)
    model = GPT2LMHeadModel(config)
    touched = randomize_norms_and_biases(model)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    print(f"model: randomized {len(touched)} LayerNorm/bias tensors; saved")

    # ---- expected outputs -------------------------------------------------------------
    with open(args.data, encoding="utf-8") as f:
        head = f.read(400)
    row0 = hf_tok(head)["input_ids"][:SEQ]
    if len(row0) != SEQ:
        raise SystemExit("not enough tokens in the head of the data file")
    gen = torch.Generator().manual_seed(ROW1_SEED)
    row1 = torch.randint(0, V, (SEQ,), generator=gen).tolist()
    input_ids = torch.tensor([row0, row1], dtype=torch.long)

    # Reference in float64 from exactly the stored float32 weights (reloaded from disk).
    ref = GPT2LMHeadModel.from_pretrained(out, attn_implementation="eager").double().eval()
    with torch.no_grad():
        logits64 = ref(input_ids).logits
        logits7_64 = ref(input_ids[:, :SHORT]).logits
        hf_loss = ref(input_ids[:1], labels=input_ids[:1]).loss
        # Cross-check: causal masking means a prefix's logits equal the prefix of the full run,
        # and the default (sdpa) attention agrees with eager.
        if (logits7_64 - logits64[:, :SHORT]).abs().max() > 1e-12:
            raise SystemExit("prefix logits disagree with the full-sequence logits")
        sdpa = GPT2LMHeadModel.from_pretrained(out, attn_implementation="sdpa").double().eval()
        if (sdpa(input_ids).logits - logits64).abs().max() > 1e-10:
            raise SystemExit("sdpa and eager attention disagree")
        # The HF loss is the mean next-token cross-entropy with labels shifted by one; HF
        # evaluates it after casting the logits to float32, so the stored value is the same
        # formula evaluated in float64, checked against HF's own number.
        loss64 = torch.nn.functional.cross_entropy(logits64[0, :-1], input_ids[0, 1:])
        if (hf_loss.double() - loss64).abs() > 1e-5:
            raise SystemExit(f"HF loss {hf_loss.item()} != shifted cross-entropy {loss64.item()}")

    tensors = {
        "input_ids": input_ids.to(torch.int32).contiguous(),
        "logits": logits64.to(torch.float32).contiguous(),
        "logits_len7": logits7_64.to(torch.float32).contiguous(),
        "loss": loss64.reshape(1).to(torch.float32).contiguous(),
    }
    # One metadata key only: safetensors keeps metadata in a hash map whose order (and so the
    # file's bytes) would vary from run to run with several keys. Provenance is in README.md.
    safetensors.torch.save_file(tensors, os.path.join(out, "expected.safetensors"),
                                metadata={"format": "pt"})
    print(f"expected: input_ids row0 {row0}")
    print(f"expected: input_ids row1 {row1}")
    print(f"expected: loss {loss64.item():.6f}")

    for f in os.listdir(out):  # safetensors writes 0600; make the fixture world-readable
        os.chmod(os.path.join(out, f), 0o644)
    write_readme(out, V, eot_id, row0, row1, loss64.item())
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out} ({total} bytes)")


def write_readme(out, V, eot_id, row0, row1, loss):
    files = sorted(f for f in os.listdir(out) if f != "README.md")
    sums = "\n".join(f"{sha256(os.path.join(out, f))}  {f}" for f in files)
    sizes = "\n".join(f"| `{f}` | {os.path.getsize(os.path.join(out, f))} |" for f in files)
    text = f"""# hf_gpt2_tiny

A tiny GPT-2 checkpoint written by Hugging Face `transformers`, used to test starling's
GPT-2 importer against the reference implementation. Random weights (not trained); only the
tokenizer is trained (on Tiny Shakespeare).

Generated by `bench/hf/make_fixture.py` (deterministic; a rerun gives byte-identical files):

```
bash bench/hf/setup_venv.sh
bench/hf/.venv/bin/python bench/hf/make_fixture.py
```

Checked with `bench/hf/.venv/bin/python bench/hf/check_hf_dir.py tests/fixtures/hf_gpt2_tiny`.

Versions: torch {torch.__version__.split("+")[0]}, transformers {transformers.__version__},
tokenizers {tokenizers.__version__}, safetensors {safetensors.__version__},
Python {sys.version.split()[0]}.

## Contents

| file | bytes |
| --- | --- |
{sizes}

- `vocab.json`, `merges.txt`: GPT-2 byte-level BPE (`tokenizers.ByteLevelBPETokenizer`,
  vocab_size {VOCAB_SIZE}, min_frequency 2, no prefix space, no normalizer) trained on
  `shared/data/tinyshakespeare/input.txt`. {V} tokens with dense ids 0..{V - 1};
  `{EOT}` is id {eot_id}. `merges.txt` starts with `#version: 0.2`, then `left right`
  per line in merge-rank order.
- `tokenizer.json`, `tokenizer_config.json`: the same tokenizer as saved by
  `GPT2Tokenizer.save_pretrained`.
- `generation_config.json`: written by `save_pretrained` next to `config.json`.
- `config.json`, `model.safetensors`: `GPT2LMHeadModel(GPT2Config(vocab_size={V},
  n_positions=32, n_embd=32, n_layer=2, n_head=4, activation_function="gelu_new",
  resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, bos_token_id={eot_id}, eos_token_id={eot_id}))`
  after `torch.manual_seed(0)`; then every LayerNorm weight is set to `1 + 0.1*randn` and
  every LayerNorm, Linear and Conv1D bias to `0.05*randn` (generator seed {PARAM_SEED}), so a
  loader that drops a bias or a LayerNorm parameter fails. Saved with
  `save_pretrained(dir, safe_serialization=True)`, float32. `lm_head.weight` is tied to
  `transformer.wte.weight` and is not stored.
- `expected.safetensors`:
  - `input_ids` int32 [2, {SEQ}]: row 0 = the first {SEQ} ids of the encoding of the start of
    Tiny Shakespeare (`First Citizen:\\nBefore we ...`): `{row0}`;
    row 1 = `torch.randint(0, {V}, ({SEQ},), generator=torch.Generator().manual_seed({ROW1_SEED}))`:
    `{row1}`.
  - `logits` float32 [2, {SEQ}, {V}]: eval-mode logits, computed in float64 (model `.double()`,
    eager attention) from the stored float32 weights, then rounded to float32.
  - `logits_len7` float32 [2, {SHORT}, {V}]: the same for `input_ids[:, :{SHORT}]` alone.
  - `loss` float32 [1]: the loss of `model(input_ids[:1], labels=input_ids[:1])`, i.e. the
    mean next-token cross-entropy of row 0 with labels shifted by one
    (`cross_entropy(logits[0, :-1], input_ids[0, 1:])`), evaluated in float64 = {loss:.6f}.
    (transformers itself casts the logits to float32 before the loss; its value agrees to
    1e-5.)

## sha256

```
{sums}
```
"""
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
