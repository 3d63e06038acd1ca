#!/usr/bin/python3
"""Train the tiny Kimi K3 on the Brown corpus (tools/train/README.md).

  /usr/bin/python3 tools/train/train.py --data build/train-data --work build/train-run --steps N

Resumable: the state (weights, router biases, optimizer, step, elapsed time) is written to
WORK/ckpt.pt every --ckpt-every steps (temp file, fsync, rename) and read back on the next
start. Batches are a function of (seed, step), so a resumed run sees the batches an
uninterrupted one would have. Progress goes to stdout and WORK/train.log.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3_torch  # noqa: E402


class Data:
    """The prepared corpus (tools/train/prepare_data.py) mapped onto the model's rows.

    Inputs are embedding rows (every id the corpus uses); targets are head classes: the
    `head_rows` ids most frequent in the training split get their own class, every other used
    id is the shared "rare" class (k3_torch.K3).
    """

    def __init__(self, data_dir, used_ids, head_rows):
        raw = {}
        for s in ("train", "heldout"):
            raw["text_" + s] = self._read(data_dir, "text_%s.u32" % s, "<u4")
            raw["chat_" + s] = self._read(data_dir, "chat_%s.u32" % s, "<u4")
        counts = np.bincount(np.concatenate([raw["text_train"], raw["chat_train"]]), minlength=163840)
        self.embed_ids = sorted(int(i) for i in used_ids)
        by_count = sorted(self.embed_ids, key=lambda i: (-counts[i], i))
        self.head_ids = sorted(by_count[:head_rows])
        row_of = np.full(163840, -1, np.int64)
        row_of[np.asarray(self.embed_ids)] = np.arange(len(self.embed_ids))
        class_of = np.full(163840, len(self.head_ids), np.int64)  # the rare class
        class_of[np.asarray(self.head_ids)] = np.arange(len(self.head_ids))
        self.inputs, self.targets = {}, {}
        for key, ids in raw.items():
            rows = row_of[ids]
            if (rows < 0).any():
                raise ValueError("%s: token %d is not in meta.json used_ids" % (key, ids[rows < 0][0]))
            self.inputs[key], self.targets[key] = rows, class_of[ids]
        self.chat_idx = {s: self._read(data_dir, "chat_%s.idx" % s, "<i8").reshape(-1, 3)
                         for s in ("train", "heldout")}

    @staticmethod
    def _read(data_dir, name, dtype):
        return np.fromfile(os.path.join(data_dir, name), dtype).astype(np.int64)

    def text_rows(self, split, rng, count, seq):
        key = "text_" + split
        starts = rng.integers(0, len(self.inputs[key]) - seq - 1, size=count)
        x = np.stack([self.inputs[key][s:s + seq] for s in starts])
        y = np.stack([self.targets[key][s + 1:s + seq + 1] for s in starts])
        return x, y, np.ones((count, seq), np.float32)

    def chat_rows(self, split, rng, count, seq, picks=None):
        key, idx = "chat_" + split, self.chat_idx[split]
        fits = np.nonzero(idx[:, 2] <= seq + 1)[0]
        picks = fits[rng.integers(0, len(fits), size=count)] if picks is None else picks
        x = np.zeros((len(picks), seq), np.int64)
        y = np.zeros((len(picks), seq), np.int64)
        mask = np.zeros((len(picks), seq), np.float32)
        for r, c in enumerate(picks):
            start, prompt, total = idx[c]
            x[r, :total - 1] = self.inputs[key][start:start + total - 1]
            y[r, :total - 1] = self.targets[key][start + 1:start + total]
            mask[r, prompt - 1:total - 1] = 1.0  # targets: the reply, from its first token to EOM
        return x, y, mask


def loss_of(model, x, y, mask):
    logits = model.logits(model.hidden(torch.from_numpy(x)))
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1),
                         reduction="none")
    m = torch.from_numpy(mask).reshape(-1)
    return (ce * m).sum() / m.sum().clamp(min=1.0), m.sum()


def step_loss(model, text, chat):
    """One forward over the text and chat rows together: (loss, text loss, chat loss).

    Text rows weigh by token; the chat rows' reply loss is averaged over its tokens and weighs
    as many rows as there are chat rows.
    """
    x = torch.from_numpy(np.concatenate([text[0], chat[0]]))
    y = torch.from_numpy(np.concatenate([text[1], chat[1]]))
    logits = model.logits(model.hidden(x))
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                         reduction="none").reshape(x.shape[0], -1)
    n = len(text[0])
    lt = (ce[:n] * torch.from_numpy(text[2])).sum() / float(text[2].sum())
    lc = (ce[n:] * torch.from_numpy(chat[2])).sum() / max(float(chat[2].sum()), 1.0)
    return (lt * n + lc * len(chat[0])) / x.shape[0], lt, lc


@torch.no_grad()
def evaluate(model, data, seq, windows=48):
    """Held-out text perplexity over fixed windows, and the held-out chat reply loss."""
    model.eval()
    rng = np.random.default_rng(12345)
    tot, n = 0.0, 0.0
    for _ in range(windows // 16):
        loss, cnt = loss_of(model, *data.text_rows("heldout", rng, 16, seq))
        tot, n = tot + float(loss) * float(cnt), n + float(cnt)
    chat_idx = data.chat_idx["heldout"]
    picks = np.arange(min(64, len(chat_idx)))
    picks = picks[chat_idx[picks, 2] <= seq + 1]
    closs, ccnt = loss_of(model, *data.chat_rows("heldout", rng, 0, seq, picks=picks))
    model.train()
    return math.exp(tot / n), float(closs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="build/train-data")
    ap.add_argument("--work", default="build/train-run")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=16, help="rows per step (text + chat)")
    ap.add_argument("--chat-rows", type=int, default=6, help="of which chat conversations")
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--head-rows", type=int, default=16384,
                    help="most frequent training ids with their own lm_head row")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--bias-rate", type=float, default=1e-3, help="router bias step (noaux_tc)")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--max-minutes", type=float, default=0, help="stop (resumably) after this long")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    os.makedirs(a.work, exist_ok=True)
    with open(os.path.join(a.data, "meta.json")) as f:
        meta = json.load(f)
    data = Data(a.data, meta["used_ids"], a.head_rows)
    cfg = k3_torch.default_config()
    model = k3_torch.K3(cfg, embed_ids=data.embed_ids, head_ids=data.head_ids, seed=a.seed)

    decay, plain = [], []
    for name, p in model.params.items():
        (decay if p.dim() >= 2 and "res_proj" not in name else plain).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": plain, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))
    ckpt_path = os.path.join(a.work, "ckpt.pt")
    step, elapsed = 0, 0.0
    if os.path.exists(ckpt_path):
        state = torch.load(ckpt_path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, elapsed = state["step"], state["elapsed"]
        print("resumed at step %d (%.1f min trained)" % (step, elapsed / 60), flush=True)
    log = open(os.path.join(a.work, "train.log"), "a")

    def say(line):
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    if step == 0:
        say("# train.py %s" % " ".join(sys.argv[1:]))
        say("# config %s" % json.dumps(cfg, sort_keys=True))
        say("# embedding rows %d, own lm_head rows %d, rare %d and never used %d share one row each"
            " (of %d); params %d" % (model.rows, model.head_rows, model.rare_rows, model.never_rows,
                                    cfg["vocab_size"], sum(p.numel() for p in model.params.values())))

    def save():
        tmp = ckpt_path + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "elapsed": elapsed, "cfg": cfg, "embed_ids": data.embed_ids,
                    "head_ids": data.head_ids, "args": vars(a)}, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, ckpt_path)

    model.train()
    session_start = time.time()
    t_mark, tok_mark = time.time(), 0
    while step < a.steps:
        lr = a.lr * min(1.0, (step + 1) / a.warmup)
        progress = min(1.0, step / a.steps)
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
        for group in opt.param_groups:
            group["lr"] = lr
        rng = np.random.default_rng([a.seed, step])
        t0 = time.time()
        text = data.text_rows("train", rng, a.batch - a.chat_rows, a.seq)
        chat = data.chat_rows("train", rng, a.chat_rows, a.seq)
        loss, lt, lc = step_loss(model, text, chat)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.params.values(), 1.0)
        opt.step()
        model.update_router_bias(a.bias_rate)
        step += 1
        elapsed += time.time() - t0
        tok_mark += a.batch * a.seq
        if step % 10 == 0:
            now = time.time()
            say("step %d loss text %.4f chat %.4f lr %.2e %.0f tok/s elapsed %.1f min"
                % (step, float(lt), float(lc), lr, tok_mark / (now - t_mark), elapsed / 60))
            t_mark, tok_mark = now, 0
        if step % a.eval_every == 0 or step == a.steps:
            ppl, closs = evaluate(model, data, a.seq)
            say("eval step %d heldout text ppl %.2f chat reply loss %.4f" % (step, ppl, closs))
        if step % a.ckpt_every == 0 or step == a.steps:
            save()
        if a.max_minutes and time.time() - session_start > a.max_minutes * 60:
            save()
            say("stopped at step %d after %.1f min this session (resume to continue)"
                % (step, (time.time() - session_start) / 60))
            return
    say("done: %d steps, %.1f min of training" % (step, elapsed / 60))


if __name__ == "__main__":
    main()
