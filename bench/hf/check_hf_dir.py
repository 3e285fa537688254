#!/usr/bin/env python3
"""check_hf_dir.py: checks that a GPT-2 checkpoint directory (e.g. one exported by starling)
loads cleanly in Hugging Face `transformers` and reproduces the reference logits.

    bench/hf/.venv/bin/python bench/hf/check_hf_dir.py DIR \
        [--expected tests/fixtures/hf_gpt2_tiny/expected.safetensors] [--tol 1e-4]

Steps:
  1. GPT2LMHeadModel.from_pretrained(DIR, output_loading_info=True) in float32. Fails when any
     missing / unexpected / mismatched key or error message is reported, or when transformers
     logs a warning about missing, unexpected, mismatched or newly initialized weights.
  2. If DIR has vocab.json and merges.txt, loads the tokenizer with AutoTokenizer and prints
     whether that worked (a tokenizer problem is reported, not fatal, unless --require-tokenizer).
  3. Runs `input_ids` from the expected file through the model (eval, float32) and prints the
     max |logits - expected logits|; fails when it exceeds --tol. `logits_len7` (the first 7
     tokens alone) and `loss` (labels = input_ids[:1]) are checked the same way when present.

Exit status: 0 all checks passed, 1 a check failed, 2 bad usage / unreadable input.
"""

import argparse
import logging
import os
import re
import sys
import warnings

import torch

REPO_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_EXPECTED = os.path.join(REPO_ROOT, "tests", "fixtures", "hf_gpt2_tiny", "expected.safetensors")

# Words in a transformers loading message that mean the checkpoint did not map 1:1 onto the model.
BAD_WORDS = ("missing", "unexpected", "mismatch", "newly initialized", "not initialized",
             "were not used", "not used when initializing", "should probably train")


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="checkpoint directory (config.json + model.safetensors)")
    ap.add_argument("--expected", default=DEFAULT_EXPECTED,
                    help="safetensors with input_ids and logits (default: the hf_gpt2_tiny fixture)")
    ap.add_argument("--tol", type=float, default=1e-4, help="max allowed absolute difference")
    ap.add_argument("--require-tokenizer", action="store_true",
                    help="also fail when vocab.json/merges.txt are missing or do not load")
    args = ap.parse_args()

    if not os.path.isdir(args.dir):
        print(f"error: {args.dir} is not a directory", file=sys.stderr)
        return 2
    if not os.path.isfile(args.expected):
        print(f"error: {args.expected} not found", file=sys.stderr)
        return 2

    import safetensors.torch
    import transformers
    from transformers import AutoTokenizer, GPT2LMHeadModel

    failures = []

    # ---- 1. model -------------------------------------------------------------------
    capture = Capture()
    tlog = logging.getLogger("transformers")
    tlog.addHandler(capture)
    try:
        with warnings.catch_warnings(record=True) as pywarn:
            warnings.simplefilter("always")
            model, info = GPT2LMHeadModel.from_pretrained(
                args.dir, output_loading_info=True, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - any load error is a failed check
        print(f"model: FAILED to load {args.dir}: {type(e).__name__}: {e}")
        return 1
    finally:
        tlog.removeHandler(capture)
    model = model.float().eval()
    print(f"model: loaded {args.dir} (transformers {transformers.__version__}, "
          f"{sum(p.numel() for p in model.parameters())} parameters)")

    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        val = info.get(key) or []
        if val:
            failures.append(f"loading info {key}: {sorted(map(str, val))}")
            print(f"model: {key}: {sorted(map(str, val))}")
    # transformers' own handler already printed its messages (to stderr); repeat the first
    # line only. Python warnings were swallowed by catch_warnings, so print them whole.
    logged = [(re.sub(r"\x1b\[[0-9;]*m", "", m), True) for m in capture.messages]
    logged += [(str(w.message), False) for w in pywarn]
    for msg, shown in logged:
        head = msg.splitlines()[0] if msg else ""
        print(f"model: load warning: {head + ' (full text above)' if shown else msg}")
        if any(word in msg.lower() for word in BAD_WORDS):
            failures.append(f"load warning about weights: {head}")

    # ---- 2. tokenizer ---------------------------------------------------------------
    has_tok = all(os.path.isfile(os.path.join(args.dir, f)) for f in ("vocab.json", "merges.txt"))
    if has_tok:
        try:
            tok = AutoTokenizer.from_pretrained(args.dir)
            print(f"tokenizer: loaded {type(tok).__name__} ({len(tok)} tokens)")
            if len(tok) != model.config.vocab_size:
                print(f"tokenizer: note: {len(tok)} tokens vs model vocab_size "
                      f"{model.config.vocab_size}")
        except Exception as e:  # noqa: BLE001
            print(f"tokenizer: FAILED to load: {type(e).__name__}: {e}")
            if args.require_tokenizer:
                failures.append("tokenizer did not load")
    else:
        print("tokenizer: not present (no vocab.json + merges.txt)")
        if args.require_tokenizer:
            failures.append("tokenizer files missing")

    # ---- 3. logits ------------------------------------------------------------------
    exp = safetensors.torch.load_file(args.expected)
    input_ids = exp["input_ids"].long()
    want = exp["logits"]
    if want.shape[-1] != model.config.vocab_size:
        failures.append(f"vocab size {model.config.vocab_size} != expected {want.shape[-1]}")
    else:
        with torch.no_grad():
            got = model(input_ids).logits.float()
            diff = (got - want).abs().max().item()
            print(f"logits: input_ids {tuple(input_ids.shape)}, max abs diff {diff:.3e} "
                  f"(tol {args.tol:g})")
            if not diff <= args.tol:
                failures.append(f"logits max abs diff {diff:.3e} > {args.tol:g}")
            if "logits_len7" in exp:
                n = exp["logits_len7"].shape[1]
                got7 = model(input_ids[:, :n]).logits.float()
                d7 = (got7 - exp["logits_len7"]).abs().max().item()
                print(f"logits_len{n}: max abs diff {d7:.3e}")
                if not d7 <= args.tol:
                    failures.append(f"logits_len{n} max abs diff {d7:.3e} > {args.tol:g}")
            if "loss" in exp:
                # Same as model(row0, labels=row0).loss: labels shifted by one, mean CE.
                loss = torch.nn.functional.cross_entropy(got[0, :-1], input_ids[0, 1:])
                dl = abs(loss.item() - exp["loss"].item())
                print(f"loss: {loss.item():.6f} vs expected {exp['loss'].item():.6f}, "
                      f"abs diff {dl:.3e}")
                if not dl <= args.tol:
                    failures.append(f"loss abs diff {dl:.3e} > {args.tol:g}")

    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
