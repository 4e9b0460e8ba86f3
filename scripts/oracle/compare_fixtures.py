#!/usr/bin/env python3
"""Compare two sets of oracle fixtures (for example the committed CPU ones and a fresh H200 run).

    python3 scripts/oracle/compare_fixtures.py qwen-engine/tests/fixtures /tmp/fixtures-h200

For every fixture folder in A: config.json and model.safetensors must be byte-identical (the
weights are drawn on the CPU from the seed, whatever the device), the greedy tokens must agree at
every step up to the first step whose margin (in either set) is below --margin, and the top-5
logits are compared where the tokens agree. Prints the largest logit differences; exits 1 on a
file or token mismatch. Needs only the Python standard library.
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compare_fixture(a, b, margin_floor):
    problems = []
    for name in ("config.json", "model.safetensors"):
        if not (b / name).is_file():
            problems.append(f"{b / name} is missing")
        elif sha256(a / name) != sha256(b / name):
            problems.append(f"{name} differs: the weights or config are not what the seed makes")
    ea = json.loads((a / "expected.json").read_text())
    eb = json.loads((b / "expected.json").read_text())
    print(f"{a.name}: A on {ea['device']} (torch {ea['torch']}), B on {eb['device']} (torch {eb['torch']})")
    worst_abs, worst_rel = 0.0, 0.0
    for pa, pb in zip(ea["prompts"], eb["prompts"], strict=True):
        if pa["ids"] != pb["ids"]:
            problems.append(f"prompt {pa['name']}: different prompt ids")
            continue
        agreed = 0
        for i, (sa, sb) in enumerate(zip(pa["steps"], pb["steps"], strict=True)):
            if sa["token"] != sb["token"]:
                low = min(sa["margin"], sb["margin"])
                if low >= margin_floor:
                    problems.append(
                        f"prompt {pa['name']} step {i}: token {sa['token']} vs {sb['token']} "
                        f"with margins {sa['margin']:.5f} / {sb['margin']:.5f}"
                    )
                else:
                    print(f"  prompt {pa['name']}: near-tie at step {i} (margin {low:.2e}); later steps not compared")
                break
            agreed += 1
            lb = dict(zip(sb["top5_ids"], sb["top5_logits"]))
            for tid, la in zip(sa["top5_ids"], sa["top5_logits"]):
                if tid in lb:
                    d = abs(la - lb[tid])
                    worst_abs = max(worst_abs, d)
                    worst_rel = max(worst_rel, d / max(abs(la), 1.0))
        print(f"  prompt {pa['name']} ({len(pa['ids'])} ids): {agreed}/{len(pa['steps'])} steps agree")
    print(f"  top-5 logits: max |diff| {worst_abs:.3e}, max |diff|/max(|logit|,1) {worst_rel:.3e}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path, help="fixtures folder (e.g. the committed ones)")
    ap.add_argument("b", type=Path, help="fixtures folder to compare with")
    ap.add_argument(
        "--margin",
        type=float,
        default=1e-3,
        help="a token difference at a step with a smaller top-1/top-2 margin is a near-tie, not a failure",
    )
    args = ap.parse_args()
    folders = sorted(p for p in args.a.iterdir() if (p / "expected.json").is_file())
    if not folders:
        sys.exit(f"{args.a}: no fixture folders (each has an expected.json)")
    problems = []
    for fa in folders:
        fb = args.b / fa.name
        if not (fb / "expected.json").is_file():
            problems.append(f"{fb}/expected.json is missing")
            continue
        problems += [f"{fa.name}: {p}" for p in compare_fixture(fa, fb, args.margin)]
    for p in problems:
        print(f"MISMATCH {p}")
    print("fixtures agree" if not problems else f"{len(problems)} mismatches")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
