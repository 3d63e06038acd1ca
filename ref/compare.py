#!/usr/bin/python3
"""Compare a trace against a reference trace (both safetensors).

  /usr/bin/python3 ref/compare.py got.safetensors want.safetensors [--rel 1e-4]

For every tensor in `want`:
  * float tensors: rel-L2 = ||got - want|| / ||want|| <= rel  and
                   max|got - want| <= 1e-3 * max(1, max|want|)
  * *topk_ids:     identical id sets per row (row order is undefined)
  * *topk_weights: matched by id (via the sibling topk_ids), |diff| <= 1e-5
  * other integer tensors: exact
A tensor missing from `got` (or with a different shape) fails.
Prints one line per failing tensor, then
  compare: N tensors, worst rel-L2 X (name)
Exit status 0 only if everything passes.
"""

import argparse
import os
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep ref/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from k3_ref import load_st_file  # noqa: E402  (own safetensors reader)


def rel_l2(g, w):
    g = g.astype(np.float64)
    w = w.astype(np.float64)
    return float(np.linalg.norm(g - w) / (np.linalg.norm(w) + 1e-30))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("got")
    ap.add_argument("want")
    ap.add_argument("--rel", type=float, default=1e-4)
    ap.add_argument("--wabs", type=float, default=1e-5, help="topk_weights abs tolerance")
    a = ap.parse_args(argv)

    got, _ = load_st_file(a.got)
    want, _ = load_st_file(a.want)
    fails = []
    worst, worst_name = -1.0, "-"

    for name in sorted(want):
        w = want[name]
        if name not in got:
            fails.append("%s: missing" % name)
            continue
        g = got[name]
        if tuple(g.shape) != tuple(w.shape):
            fails.append("%s: shape %s != %s" % (name, list(g.shape), list(w.shape)))
            continue
        if name.endswith("topk_ids"):
            bad = [r for r in range(w.shape[0]) if set(g[r].tolist()) != set(w[r].tolist())]
            if bad:
                fails.append("%s: id sets differ in %d rows (first row %d: got %s want %s)"
                             % (name, len(bad), bad[0], sorted(g[bad[0]].tolist()),
                                sorted(w[bad[0]].tolist())))
        elif name.endswith("topk_weights"):
            idn = name[:-len("topk_weights")] + "topk_ids"
            if idn not in got or idn not in want:
                fails.append("%s: no %s to match ids" % (name, idn))
                continue
            gi, wi = got[idn], want[idn]
            err, msg = 0.0, None
            for r in range(w.shape[0]):
                gm = {int(i): float(x) for i, x in zip(gi[r], g[r])}
                for i, x in zip(wi[r], w[r]):
                    if int(i) not in gm:
                        msg = "id %d missing in row %d" % (int(i), r)
                        break
                    err = max(err, abs(gm[int(i)] - float(x)))
                if msg:
                    break
            if msg or err > a.wabs:
                fails.append("%s: %s" % (name, msg or "max abs diff %.3g > %g" % (err, a.wabs)))
        elif w.dtype.kind == "f":
            rl = rel_l2(g, w)
            ma = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) if w.size else 0.0
            lim = 1e-3 * max(1.0, float(np.max(np.abs(w))) if w.size else 0.0)
            if not np.isfinite(rl) or rl > worst:
                worst, worst_name = rl, name
            if not (rl <= a.rel and ma <= lim):
                fails.append("%s: rel-L2 %.3g (limit %g), max abs %.3g (limit %.3g)"
                             % (name, rl, a.rel, ma, lim))
        else:
            if not np.array_equal(g, w):
                n = int(np.sum(g != w))
                fails.append("%s: %d of %d values differ" % (name, n, w.size))

    for f in fails:
        print("FAIL " + f)
    print("compare: %d tensors, worst rel-L2 %.3g (%s)%s"
          % (len(want), worst, worst_name, "" if not fails else ", %d FAILED" % len(fails)))
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main())
