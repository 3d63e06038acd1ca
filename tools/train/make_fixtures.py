#!/usr/bin/python3
"""Write the trained model's test fixtures into tests/data/k3-mini/ (README there).

  /usr/bin/python3 tools/train/make_fixtures.py --model assets/k3-mini --data build/train-data

* heldout_text.u32: WINDOWS x LEN held-out token ids (little-endian u32), windows back to back,
  taken at fixed offsets of the held-out text split (never seen in training).
* heldout_prompts.jsonl: held-out chat prompts ({"ids": [...]}, ending in the generation prompt).
* oracle.safetensors: the training model's own forward in float64 (snapshot.load, i.e. from
  the exported files) on the first oracle window: "ids" I64 [T], "logit_ids" I64 [K] (every id
  with its own lm_head row, then one "rare" and one "never used" id standing for the ids that
  share a row), "logits" F32 [T, K] (rounded from float64), "shared_count" I64 [2], "router_margin" F64 [T]
  (the smallest gap, over every MoE layer, between the k-th and (k+1)-th biased router score:
  a float32 engine may only pick other experts where it is ~1e-6).
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import snapshot  # noqa: E402

WINDOWS, LEN = 8, 128
PROMPTS = 6
ORACLE_LEN = 64


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="assets/k3-mini")
    ap.add_argument("--data", default="build/train-data")
    ap.add_argument("--out", default="tests/data/k3-mini")
    a = ap.parse_args()
    torch.set_num_threads(2)
    os.makedirs(a.out, exist_ok=True)

    text = np.fromfile(os.path.join(a.data, "text_heldout.u32"), "<u4")
    step = (len(text) - LEN) // WINDOWS
    windows = np.stack([text[w * step:w * step + LEN] for w in range(WINDOWS)])
    snapshot.write_atomic(os.path.join(a.out, "heldout_text.u32"), windows.astype("<u4").tobytes())

    chat = np.fromfile(os.path.join(a.data, "chat_heldout.u32"), "<u4")
    idx = np.fromfile(os.path.join(a.data, "chat_heldout.idx"), "<i8").reshape(-1, 3)
    lines = []
    for start, prompt, _ in idx[:: max(1, len(idx) // PROMPTS)][:PROMPTS]:
        lines.append(json.dumps({"ids": chat[start:start + prompt].tolist()}))
    snapshot.write_atomic(os.path.join(a.out, "heldout_prompts.jsonl"), ("\n".join(lines) + "\n").encode())

    model = snapshot.load(a.model, torch.float64)
    with open(os.path.join(a.model, "training.json")) as f:
        info = json.load(f)
    lm_head = model.get("lm_head.weight").detach().numpy()
    # Rows that share a weight row: find one "rare" and one "never" representative by value.
    _, first, inverse, counts = np.unique(lm_head, axis=0, return_index=True, return_inverse=True,
                                          return_counts=True)
    order = np.argsort(-counts)
    shared = [int(first[g]) for g in order[:2]]
    own = np.nonzero(counts[inverse] == 1)[0]
    logit_ids = np.concatenate([own, np.array(shared)])
    ids = torch.from_numpy(windows[0][:ORACLE_LEN].astype(np.int64)).unsqueeze(0)
    routing = []
    with torch.no_grad():
        logits = model.logits(model.hidden(ids, routing))[0].numpy()
    margin = np.min(np.stack([m.numpy() for _, m in routing]), axis=0)
    tensors = [
        ("ids", "I64", ids.shape[1:], ids[0].numpy().astype("<i8").tobytes()),
        ("logit_ids", "I64", logit_ids.shape, logit_ids.astype("<i8").tobytes()),
        ("logits", "F32", (ORACLE_LEN, len(logit_ids)), logits[:, logit_ids].astype("<f4").tobytes()),
        ("shared_count", "I64", (2,), np.array([counts[order[0]], counts[order[1]]]).astype("<i8").tobytes()),
        ("router_margin", "F64", margin.shape, margin.astype("<f8").tobytes()),
    ]
    snapshot.write_atomic(os.path.join(a.out, "oracle.safetensors"), snapshot.safetensors_bytes(tensors))

    # What the shared rows do to sampling: the mass of each shared class on the held-out windows.
    rep_rare, rep_never = (shared if counts[order[0]] < counts[order[1]] else shared[::-1])
    n_rare, n_never = sorted(int(counts[g]) for g in order[:2])
    with torch.no_grad():
        lp = torch.log_softmax(model.logits(model.hidden(torch.from_numpy(windows.astype(np.int64)))), -1)
    p_rare = (torch.exp(lp[..., rep_rare]) * n_rare).mean().item()
    p_never = (torch.exp(lp[..., rep_never]) * n_never).mean().item()
    print("shared rows on held-out text: rare class (%d ids) mean mass %.4f, never-used class (%d ids) %.2e"
          % (n_rare, p_rare, n_never, p_never))
    print("fixtures: %d windows x %d, %d prompts, oracle %d x %d (own %d, shared %s), "
          "smallest router margin %.2e, model step %d"
          % (WINDOWS, LEN, len(lines), ORACLE_LEN, len(logit_ids), len(own),
             [int(counts[g]) for g in order[:2]], margin.min(), info["steps"]))


if __name__ == "__main__":
    main()
