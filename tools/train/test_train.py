#!/usr/bin/python3
"""The training tool's own tests (`make train-test`; needs scripts/setup.sh --train).

  /usr/bin/python3 tools/train/test_train.py

1. kda_chunked equals kda_recurrent (float64, forward and gradients, a length that is not a
   multiple of the chunk).
2. MXFP4: the exported codes and exponents dequantise to exactly the fake-quantised weights;
   every value sits on the e2m1 grid and nothing clips.
3. The compact training softmax (own rows + the two shared classes) equals the exported
   model's softmax over all 163,840 rows, token for token.
   This also checks export -> load: the loaded model is compared with a copy of the in-memory
   one whose dense weights were rounded through BF16 as the export rounds them.
"""

import os
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import k3_torch  # noqa: E402
import snapshot  # noqa: E402

RELEASE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "assets", "k3-release")
failures = []


def check(name, ok, detail):
    print("%s %s: %s" % ("ok  " if ok else "FAIL", name, detail))
    if not ok:
        failures.append(name)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def test_chunked():
    g = torch.Generator().manual_seed(1)
    B, T, H, dk = 2, 37, 3, 16
    q = torch.nn.functional.normalize(torch.randn(B, T, H, dk, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, dk, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, dk, generator=g, dtype=torch.float64)
    ld = -5 * torch.sigmoid(3 * torch.randn(B, T, H, dk, generator=g, dtype=torch.float64))
    beta = torch.sigmoid(torch.randn(B, T, H, generator=g, dtype=torch.float64))
    ins = [t.requires_grad_() for t in (q, k, v, ld, beta)]
    w = torch.randn(B, T, H, dk, generator=g, dtype=torch.float64)
    a = k3_torch.kda_recurrent(*ins)
    ga = torch.autograd.grad((a * w).sum(), ins)
    b = k3_torch.kda_chunked(*ins, 16)
    gb = torch.autograd.grad((b * w).sum(), ins)
    worst = max([rel(b, a)] + [rel(y, x) for x, y in zip(ga, gb)])
    check("kda_chunked == kda_recurrent", worst < 1e-12, "worst rel %.1e" % worst)


def test_mxfp4():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(5, 7, 64, generator=g) * torch.exp2(torch.randint(-8, 8, (5, 7, 1), generator=g).float())
    codes, exps = k3_torch.mxfp4_codes(w)
    q = k3_torch.mxfp4_dequant(codes, exps, torch.float32)
    fq = k3_torch.mxfp4_fake_quant(w)
    grid = set(k3_torch.E2M1_MAGNITUDES)
    on_grid = all(abs(float(x)) in grid for x in (q.reshape(-1, 32) / torch.exp2(exps.reshape(-1, 1).float())).reshape(-1))
    amax = w.reshape(5, 7, 2, 32).abs().amax(-1)
    no_clip = bool((amax / torch.exp2(exps.float()) <= 6).all())
    err = float(((q - w).abs() / w.abs().reshape(5, 7, 2, 32).amax(-1, keepdim=True).repeat_interleave(32, -1)
                 .reshape(w.shape)).max())
    check("mxfp4 codes == fake quant", bool(torch.equal(q, fq)) and on_grid and no_clip,
          "equal %s, on grid %s, no clipping %s, worst error %.3f of the group max" %
          (torch.equal(q, fq), on_grid, no_clip, err))


def tiny_model():
    cfg = k3_torch.default_config()
    embed = sorted(set(range(0, 4000, 3)) | {163586, 163587, 163588, 163589})
    head = embed[: len(embed) // 2]
    m = k3_torch.K3(cfg, embed_ids=embed, head_ids=head, seed=3)
    with torch.no_grad():
        g = torch.Generator().manual_seed(4)
        for name, t in m.named_tensors():  # move the zero-initialised pieces off zero
            if name.endswith(("res_proj.weight", "lm_head.rare", "lm_head.never")):
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
    return m, embed, head


def test_softmax_and_export():
    m, embed, head = tiny_model()
    m.eval()
    ids = [embed[i] for i in (5, 900, 17, 1300, 2, 600, 1000, 44)]
    rows = torch.tensor([[embed.index(i) for i in ids]])
    with torch.no_grad():
        hidden = m.hidden(rows)
        compact = torch.log_softmax(m.logits(hidden).double(), -1)[0]
    with tempfile.TemporaryDirectory() as out:
        snapshot.export(m, os.path.join(out, "m"), RELEASE)
        full = snapshot.load(os.path.join(out, "m"), torch.float64)
        # the in-memory model with its dense weights rounded through BF16, as exported
        with torch.no_grad():
            for name, t in m.named_tensors():
                if ".experts.w" not in name and not name.endswith(snapshot.F32_SUFFIXES):
                    t.copy_(snapshot.bf16_round(t))
            ref = torch.log_softmax(m.logits(m.hidden(rows)).double(), -1)[0]
            got = torch.log_softmax(full.logits(full.hidden(torch.tensor([ids]))), -1)[0]
    own = got[:, torch.tensor(head)]
    rare_ids = [i for i in embed if i not in set(head)]
    never_ids = [i for i in range(163840) if i not in set(embed)]
    rare = torch.logsumexp(got[:, torch.tensor(rare_ids)], -1)
    never = torch.logsumexp(got[:, torch.tensor(never_ids)], -1)
    merged = torch.cat([own, rare.unsqueeze(-1), never.unsqueeze(-1)], -1)
    d = float((merged - ref).abs().max())
    check("compact softmax == exported 163,840-row softmax", d < 1e-4, "max |log p| difference %.1e" % d)
    d0 = float((merged - compact).abs().max())
    print("     (BF16 rounding of the random-init model moved log p by up to %.2f: near-tied router scores flip)" % d0)


def main():
    torch.set_num_threads(2)
    test_chunked()
    test_mxfp4()
    test_softmax_and_export()
    if failures:
        sys.exit("test_train: %d failed: %s" % (len(failures), ", ".join(failures)))
    print("test_train: all passed")


if __name__ == "__main__":
    main()
