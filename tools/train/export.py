#!/usr/bin/python3
"""Export a training checkpoint as a Hugging Face snapshot (tools/train/README.md).

  /usr/bin/python3 tools/train/export.py --work build/train-run --out assets/k3-mini

Writes the snapshot (snapshot.export) plus TRAINING.md-facing files: train.log (copied) and
training.json (seed, command, steps, minutes, row counts).
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3_torch  # noqa: E402
import snapshot  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="build/train-run")
    ap.add_argument("--out", default="assets/k3-mini")
    ap.add_argument("--release", default=os.path.join(ROOT, "assets", "k3-release"),
                    help="where config.json's template and the tokenizer files come from")
    a = ap.parse_args()
    state = torch.load(os.path.join(a.work, "ckpt.pt"))
    model = k3_torch.K3(state["cfg"], embed_ids=state["embed_ids"], head_ids=state["head_ids"])
    model.load_state_dict(state["model"])
    with open(os.path.join(a.work, "train.log"), "rb") as f:
        log = f.read()
    info = {
        "steps": state["step"],
        "training_minutes": round(state["elapsed"] / 60, 1),
        "args": state["args"],
        "embedding_rows": model.rows,
        "own_lm_head_rows": model.head_rows,
        "rare_rows_sharing_one_lm_head_row": model.rare_rows,
        "never_used_rows_sharing_one_lm_head_row": model.never_rows,
    }
    extra = [("train.log", log), ("training.json", (json.dumps(info, indent=2) + "\n").encode())]
    total = snapshot.export(model, a.out, a.release, extra)
    print("export: step %d -> %s (%d tensor bytes)" % (state["step"], a.out, total))


if __name__ == "__main__":
    main()
