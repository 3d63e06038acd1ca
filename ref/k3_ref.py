#!/usr/bin/python3
"""Independent float64 numpy reference of the Kimi K3 text model forward pass.

Derived only from the written specification (docs/architecture.md sections 1-4 and
the k3-tiny fixture README), NOT from the C++ engine, so that it can be used to
catch mistakes in the engine.

Usage:
  /usr/bin/python3 ref/k3_ref.py trace <model_dir> --ids 1,2,3 --out trace.safetensors
                                  [--decode N] [--layers N]

Everything is computed in float64 from exactly widened checkpoint weights
(BF16 -> F32 -> F64, MXFP4 dequantised exactly). Results are stored as F32
(ids as I64).

Notation: matrices are nn.Linear weights W[out][in]; with activations stored
row-wise as X[T, in] a projection is  Y = X @ W.T .
"""

import argparse
import glob
import json
import os
import struct
import sys
import time

import numpy as np

# --------------------------------------------------------------------------
# safetensors I/O (own reader / writer: struct + json + numpy)
# --------------------------------------------------------------------------

_ST_DTYPES = {  # name -> (numpy dtype of the raw storage, itemsize)
    "F64": (np.float64, 8),
    "F32": (np.float32, 4),
    "F16": (np.float16, 2),
    "BF16": (np.uint16, 2),   # widened by hand, see _decode
    "I64": (np.int64, 8),
    "I32": (np.int32, 4),
    "I16": (np.int16, 2),
    "I8": (np.int8, 1),
    "U8": (np.uint8, 1),
    "BOOL": (np.bool_, 1),
}


def read_st_header(path):
    """Return (data_start, {name: {dtype, shape, data_offsets}}) of a file.

    File layout: u64 LE header length N, N bytes of JSON, then the data region.
    The optional "__metadata__" entry is dropped.
    """
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n).decode("utf-8"))
    hdr.pop("__metadata__", None)
    return 8 + n, hdr


def _decode(raw, dtype, shape):
    """Raw little-endian bytes -> numpy array (BF16 widened exactly to F32)."""
    npdt, _ = _ST_DTYPES[dtype]
    a = np.frombuffer(raw, dtype=np.dtype(npdt).newbyteorder("<"))
    if dtype == "BF16":
        # BF16 is the upper half of an IEEE F32: shift into the upper 16 bits.
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a.reshape(shape)


def _read_range(path, offset, nbytes):
    out = bytearray(nbytes)
    mv = memoryview(out)
    with open(path, "rb") as f:
        f.seek(offset)
        got = 0
        while got < nbytes:  # chunked: large tensors / short reads
            n = f.readinto(mv[got:got + min(nbytes - got, 1 << 30)])
            if not n:
                raise IOError("short read in %s" % path)
            got += n
    return bytes(out)


def load_st_file(path):
    """Read every tensor of one safetensors file -> (dict name->array, dtypes)."""
    start, hdr = read_st_header(path)
    out, dts = {}, {}
    with open(path, "rb") as f:
        for name, e in hdr.items():
            b, en = e["data_offsets"]
            f.seek(start + b)
            out[name] = _decode(f.read(en - b), e["dtype"], e["shape"])
            dts[name] = e["dtype"]
    return out, dts


def write_st_file(path, tensors):
    """Write {name: ndarray} (float32 / int64 / ...) as a safetensors file."""
    rev = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
           np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
           np.dtype(np.uint8): "U8", np.dtype(np.float16): "F16"}
    hdr, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        hdr[name] = {"dtype": rev[a.dtype], "shape": list(a.shape),
                     "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-(8 + len(h))) % 8)  # data starts 8-aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)


class Checkpoint:
    """Lazy name -> tensor access over a sharded HF snapshot.

    Uses model.safetensors.index.json when present, otherwise scans *.safetensors
    (sorted). Only headers are parsed up front; a tensor's bytes are read on
    first use, so vision tensors are never read.
    """

    def __init__(self, model_dir):
        self.dir = model_dir
        self._files = {}   # file -> (data_start, header)
        self._where = {}   # name -> file
        idx = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                wm = json.load(f)["weight_map"]
            self._where = {k: os.path.join(model_dir, v) for k, v in wm.items()}
        else:
            for p in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
                for k in self._header(p)[1]:
                    self._where.setdefault(k, p)
        # name prefix: "language_model." in the released snapshot, "" in flat fixtures
        probe = "model.layers.0.input_layernorm.weight"
        if "language_model." + probe in self._where:
            self.prefix = "language_model."
        elif probe in self._where:
            self.prefix = ""
        else:
            raise KeyError("cannot find %s (with or without language_model.)" % probe)

    def _header(self, path):
        if path not in self._files:
            self._files[path] = read_st_header(path)
        return self._files[path]

    def has(self, name):
        return self.prefix + name in self._where

    def raw(self, name):
        """Tensor as stored (BF16 widened to F32, U8 kept as U8)."""
        full = self.prefix + name
        path = self._where[full]
        start, hdr = self._header(path)
        e = hdr[full]
        b, en = e["data_offsets"]
        return _decode(_read_range(path, start + b, en - b), e["dtype"], e["shape"])

    def get(self, name):
        """Float tensor widened to float64."""
        return self.raw(name).astype(np.float64)


# --------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------

class Cfg:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            root = json.load(f)
        c = root.get("text_config", root)   # wrapper config, or flat fixture
        la = c.get("linear_attn_config", {}) or {}
        self.D = c["hidden_size"]
        self.L = c["num_hidden_layers"]
        self.V = c["vocab_size"]
        self.eps = c.get("rms_norm_eps", 1e-5)
        self.block = c["attn_res_block_size"]
        self.first_dense = c.get("first_k_dense_replace", 0)
        self.moe_freq = c.get("moe_layer_freq", 1)
        self.num_experts = c.get("num_experts")
        self.topk = c.get("num_experts_per_token", c.get("num_experts_per_tok"))
        self.n_shared = c.get("num_shared_experts", 0) or 0
        self.scaling = c.get("routed_scaling_factor", 1.0)
        self.renorm = c.get("moe_renormalize", True)
        self.b1 = c.get("activation_situ_beta", 4.0)
        self.b2 = c.get("activation_situ_linear_beta", 25.0)
        # MLA
        self.H = c["num_attention_heads"]
        self.q_lora = c.get("q_lora_rank")
        self.kv_lora = c["kv_lora_rank"]
        self.nope = c["qk_nope_head_dim"]
        self.rope = c["qk_rope_head_dim"]
        self.vdim = c["v_head_dim"]
        self.mla_eps = 1e-6   # q_a/kv_a_layernorm: class default, NOT rms_norm_eps
        # KDA
        self.kH = la.get("num_heads")
        self.kd = la.get("head_dim")
        self.conv = la.get("short_conv_kernel_size", 4)
        self.lower = la.get("gate_lower_bound", -5.0)
        self.kda_layers = set(la.get("kda_layers", []) or [])   # 1-BASED
        act = c.get("hidden_act", "situ")
        if act != "situ":
            raise ValueError("hidden_act %r: only SiTU is implemented" % act)
        for key, want in (("mla_use_nope", True), ("mla_use_output_gate", True),
                          ("latent_moe_use_norm", True),
                          ("moe_router_activation_func", "sigmoid")):
            if key in c and c[key] != want:
                raise ValueError("%s = %r not supported (expected %r)" % (key, c[key], want))
        if la and la.get("use_full_rank_gate", True) is not True:
            raise ValueError("use_full_rank_gate false not supported")

    def is_kda(self, i):     # i is 0-based; kda_layers is 1-based
        return (i + 1) in self.kda_layers

    def is_moe(self, i):
        return (self.num_experts is not None and i >= self.first_dense
                and i % self.moe_freq == 0)


# --------------------------------------------------------------------------
# Elementwise helpers (float64)
# --------------------------------------------------------------------------

def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))   # overflow-free, exact identity


def silu(x):
    return x * sigmoid(x)


def rmsnorm(x, w, eps):
    """RMSNorm over the last axis:  x / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def situ(g, u, b1, b2):
    """SiTU-GLU:  [b1*tanh(g/b1)*sigmoid(g)] * [b2*tanh(u/b2)]."""
    return (b1 * np.tanh(g / b1) * sigmoid(g)) * (b2 * np.tanh(u / b2))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


# E2M1 code table: bit 3 = sign, bits 0..2 index {0,.5,1,1.5,2,3,4,6}
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6],
                dtype=np.float64)


def dequant_mxfp4(packed, scale):
    """MXFP4 -> float64 W[out][in].

    packed[o][j]: low nibble = column 2j, high nibble = column 2j+1.
    scale[o][g]:  ue8m0 exponent for columns [G*g, G*g+G), G = in / n_groups.
    W[o][i] = E2M1[nib(o,i)] * 2^(scale[o][i//G] - 127)
    """
    packed = np.asarray(packed, dtype=np.uint8)
    scale = np.asarray(scale, dtype=np.uint8)
    O, half = packed.shape
    I = 2 * half
    assert I % scale.shape[1] == 0 and scale.shape[0] == O
    G = I // scale.shape[1]
    if np.any(scale == 255):
        raise ValueError("MXFP4 scale byte 255 (NaN) in checkpoint")
    nib = np.empty((O, I), dtype=np.uint8)
    nib[:, 0::2] = packed & 0x0F
    nib[:, 1::2] = packed >> 4
    s = np.ldexp(1.0, scale.astype(np.int64) - 127)          # 2^(s-127)
    return E2M1[nib] * np.repeat(s, G, axis=1)


# --------------------------------------------------------------------------
# Model blocks. Every function maps X[T, D] (all positions) -> Y[T, D], causal.
# --------------------------------------------------------------------------

def attnres_mix(sources, w_norm, w_proj, eps):
    """AttnRes mix, per token.

    w = res_norm.weight (.) res_proj.weight[0]
    score_e = dot(v_e, w) / sqrt(mean(v_e^2) + eps)       (RMS-normalised KEY)
    p = softmax_e(score)                                   (over sources)
    Mix = sum_e p_e * v_e                                  (RAW sources)
    sources: list of [T, D]; returns [T, D].
    """
    w = w_norm * w_proj.reshape(-1)
    V = np.stack(sources, axis=0)                              # [S, T, D]
    rms = np.sqrt(np.mean(V * V, axis=-1) + eps)               # [S, T]
    score = (V @ w) / rms                                      # [S, T]
    p = softmax(score, axis=0)
    return np.einsum("st,std->td", p, V)


def kda_attention(cfg, ck, pre, x):
    """Kimi Delta Attention over all positions. x = RMSNorm(attn_in) [T, D]."""
    T = x.shape[0]
    H, K = cfg.kH, cfg.conv
    Wq, Wk, Wv = ck.get(pre + "q_proj.weight"), ck.get(pre + "k_proj.weight"), ck.get(pre + "v_proj.weight")
    P = Wq.shape[0]
    dk = P // H
    dv = Wv.shape[0] // H
    q0, k0, v0 = x @ Wq.T, x @ Wk.T, x @ Wv.T                    # [T, P]

    def short_conv(s, name):
        # depthwise causal conv, width K, left zero padding, tap K-1 = current token:
        #   y_t[c] = sum_j w[c][j] * s_{t-(K-1)+j}[c],  s_{<0} = 0;   out = silu(y)
        w = ck.get(pre + name).reshape(s.shape[1], K)
        sp = np.concatenate([np.zeros((K - 1, s.shape[1])), s], axis=0)
        y = np.zeros_like(s)
        for j in range(K):
            y += w[:, j] * sp[j:j + T]
        return silu(y)

    q = short_conv(q0, "q_conv1d.weight").reshape(T, H, dk)
    k = short_conv(k0, "k_conv1d.weight").reshape(T, H, dk)
    v = short_conv(v0, "v_conv1d.weight").reshape(T, H, dv)

    # per-head L2 norm with 1e-6 added to the sum of squares; q scaled by dk^-0.5
    q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6) * dk ** -0.5
    k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)

    # gate, per key channel:  g = lower * sigmoid(exp(A_log[h]) * (f_b(f_a x) + dt_bias)),  a = exp(g)
    graw = (x @ ck.get(pre + "f_a_proj.weight").T) @ ck.get(pre + "f_b_proj.weight").T   # [T, P]
    z = (graw + ck.get(pre + "dt_bias").reshape(-1)).reshape(T, H, dk)
    A_all = ck.get(pre + "A_log").reshape(-1)
    A_log = A_all[:H]                                      # per head; tail is zero padding
    if np.any(A_all[H:] != 0):
        print("warning: %sA_log has non-zero entries past head %d" % (pre, H), file=sys.stderr)
    g = cfg.lower * sigmoid(np.exp(A_log)[None, :, None] * z)
    a = np.exp(g)                                          # [T, H, dk] in (e^lower, 1)
    beta = sigmoid(x @ ck.get(pre + "b_proj.weight").T)    # [T, H]

    # recurrence, S[h] is [dk, dv] indexed S[key][value], zero at t = 0:
    #   S <- Diag(a_t) S                       1. decay rows
    #   u  = beta_t * (v_t - S^T k_t)           2-3. delta against the prediction
    #   S <- S + k_t u^T                        4. rank-1 write
    #   o_t = S^T q_t                           5. read with q AFTER the write
    o = np.zeros((T, H, dv))
    for h in range(H):
        S = np.zeros((dk, dv))
        for t in range(T):
            S = a[t, h][:, None] * S
            u = beta[t, h] * (v[t, h] - k[t, h] @ S)
            S = S + np.outer(k[t, h], u)
            o[t, h] = q[t, h] @ S

    # per-head RMSNorm (shared o_norm, eps rms_norm_eps), then (.) sigmoid(g_proj x), o_proj
    o = rmsnorm(o, ck.get(pre + "o_norm.weight").reshape(-1), cfg.eps)
    gate = sigmoid(x @ ck.get(pre + "g_proj.weight").T).reshape(T, H, dv)
    return (o * gate).reshape(T, H * dv) @ ck.get(pre + "o_proj.weight").T


def mla_attention(cfg, ck, pre, x):
    """Gated NoPE MLA, non-absorbed form. x = RMSNorm(attn_in) [T, D]."""
    T = x.shape[0]
    H, dn, dr, dv, kvr = cfg.H, cfg.nope, cfg.rope, cfg.vdim, cfg.kv_lora
    # query: cq = RMSNorm(Wqa x, eps 1e-6); Q = Wqb cq -> per head [q_nope | q_pe]
    if ck.has(pre + "q_a_proj.weight"):
        cq = rmsnorm(x @ ck.get(pre + "q_a_proj.weight").T,
                     ck.get(pre + "q_a_layernorm.weight"), cfg.mla_eps)
        Q = (cq @ ck.get(pre + "q_b_proj.weight").T).reshape(T, H, dn + dr)
    else:  # q_lora_rank null: plain q_proj
        Q = (x @ ck.get(pre + "q_proj.weight").T).reshape(T, H, dn + dr)
    q_nope, q_pe = Q[..., :dn], Q[..., dn:]
    # keys/values: ckv = Wkva x; c = RMSNorm(ckv[:kvr], eps 1e-6); k_pe = ckv[kvr:kvr+dr] raw
    ckv = x @ ck.get(pre + "kv_a_proj_with_mqa.weight").T           # [T, kvr + dr]
    c = rmsnorm(ckv[:, :kvr], ck.get(pre + "kv_a_layernorm.weight"), cfg.mla_eps)
    k_pe = ckv[:, kvr:kvr + dr]                                       # shared by all heads, NO rotation
    kvb = ck.get(pre + "kv_b_proj.weight").reshape(H, dn + dv, kvr)
    k_nope = np.einsum("tc,hoc->tho", c, kvb[:, :dn])                 # W_UK_h c_j   [T, H, dn]
    vals = np.einsum("tc,hoc->tho", c, kvb[:, dn:])                   # W_UV_h c_j   [T, H, dv]
    # s[h, t, j] = (q_nope_t . k_nope_j + q_pe_t . k_pe_j) / sqrt(dn + dr), causal j <= t
    s = (np.einsum("thd,jhd->htj", q_nope, k_nope)
         + np.einsum("thd,jd->htj", q_pe, k_pe)) / np.sqrt(dn + dr)
    s = np.where(np.tril(np.ones((T, T), dtype=bool))[None], s, -np.inf)
    p = softmax(s, axis=-1)
    ctx = np.einsum("htj,jhd->thd", p, vals)                          # [T, H, dv]
    gate = sigmoid(x @ ck.get(pre + "g_proj.weight").T).reshape(T, H, dv)
    return (ctx * gate).reshape(T, H * dv) @ ck.get(pre + "o_proj.weight").T


def dense_mlp(cfg, ck, pre, x):
    """y = Wdown SiTU(Wgate x, Wup x)."""
    return situ(x @ ck.get(pre + "gate_proj.weight").T, x @ ck.get(pre + "up_proj.weight").T,
                cfg.b1, cfg.b2) @ ck.get(pre + "down_proj.weight").T


def latent_moe(cfg, ck, pre, x):
    """LatentMoE block. x = RMSNorm(mlp_in) [T, D]. Returns (y, topk_ids, topk_weights)."""
    T = x.shape[0]
    k = cfg.topk
    # router: s = sigmoid(Wr x); select by s + bias (stable sort on -(s+bias): ties -> lower id)
    s = sigmoid(x @ ck.get(pre + "gate.weight").T)                    # [T, E]
    bias_name = pre + "gate.e_score_correction_bias"
    choice = s + (ck.get(bias_name).reshape(-1) if ck.has(bias_name) else 0.0)
    ids = np.argsort(-choice, axis=-1, kind="stable")[:, :k]          # [T, k]
    w = np.take_along_axis(s, ids, axis=-1)                           # unbiased scores
    if cfg.renorm:
        w = w / (np.sum(w, axis=-1, keepdims=True) + 1e-20)
    w = w * cfg.scaling

    # routed path in latent space:
    #   z = Wdown x;  acc = sum_k w_k * W2_e SiTU(W1_e z, W3_e z);
    #   y_r = Wup RMSNorm(acc, routed_expert_norm)
    z = x @ ck.get(pre + "routed_expert_down_proj.weight").T          # [T, latent]
    acc = np.zeros_like(z)
    cache = {}
    for e in sorted(set(ids.reshape(-1).tolist())):
        if e not in cache:
            ep = pre + "experts.%d." % e
            cache[e] = [dequant_mxfp4(ck.raw(ep + n + ".weight_packed"), ck.raw(ep + n + ".weight_scale"))
                        for n in ("w1", "w2", "w3")]                   # w1 gate, w2 down, w3 up
        W1, W2, W3 = cache[e]
        rows, slot = np.nonzero(ids == e)
        ze = z[rows]
        ye = situ(ze @ W1.T, ze @ W3.T, cfg.b1, cfg.b2) @ W2.T
        acc[rows] += w[rows, slot][:, None] * ye
    r = rmsnorm(acc, ck.get(pre + "routed_expert_norm.weight"), cfg.eps)
    y = r @ ck.get(pre + "routed_expert_up_proj.weight").T
    # shared experts (fused into one SiTU MLP), absent when num_shared_experts == 0
    if cfg.n_shared > 0:
        y = y + dense_mlp(cfg, ck, pre + "shared_experts.", x)
    return y, ids, w


# --------------------------------------------------------------------------
# Full forward
# --------------------------------------------------------------------------

def forward(cfg, ck, ids, n_layers=None, trace=None):
    """Teacher-forced forward over all positions of `ids`.

    Returns (final_hidden [T,D], logits [T,V] or None). If `trace` is a dict,
    per-layer intermediates are stored into it (float64 / int64 arrays).
    """
    L = cfg.L if n_layers is None else n_layers
    eps = cfg.eps
    ids = np.asarray(ids, dtype=np.int64)
    emb = ck.get("model.embed_tokens.weight")[ids]   # h0 = embed[id]; no scaling, no positions
    blocks = []           # completed-block sums, blocks[0] = embedding
    partial = emb         # running sum inside the current block
    tr = trace if trace is not None else {}
    for i in range(L):
        lp = "model.layers.%d." % i
        # attention-side mix: blocks so far + partial (layer 0: nothing to mix)
        a_in = partial if not blocks else attnres_mix(
            blocks + [partial], ck.get(lp + "self_attention_res_norm.weight"),
            ck.get(lp + "self_attention_res_proj.weight"), eps)
        start = (i % cfg.block == 0)
        if start:
            blocks.append(partial)          # snapshot AFTER the mix, before attention
        x = rmsnorm(a_in, ck.get(lp + "input_layernorm.weight"), eps)
        att = (kda_attention if cfg.is_kda(i) else mla_attention)(cfg, ck, lp + "self_attn.", x)
        partial = att if start else partial + att   # block reset at a block start
        m_in = attnres_mix(blocks + [partial], ck.get(lp + "mlp_res_norm.weight"),
                           ck.get(lp + "mlp_res_proj.weight"), eps)
        xm = rmsnorm(m_in, ck.get(lp + "post_attention_layernorm.weight"), eps)
        if cfg.is_moe(i):
            ffn, tk, tw = latent_moe(cfg, ck, lp + "block_sparse_moe.", xm)
            tr["layer.%d.topk_ids" % i] = tk
            tr["layer.%d.topk_weights" % i] = tw
        else:
            ffn = dense_mlp(cfg, ck, lp + "mlp.", xm)
        partial = partial + ffn
        tr["layer.%d.attn_in" % i] = a_in
        tr["layer.%d.attn_out" % i] = att
        tr["layer.%d.mlp_in" % i] = m_in
        tr["layer.%d.mlp_out" % i] = ffn
        tr["layer.%d.layer_out" % i] = partial
    # output mix over all blocks + partial -> model.norm -> lm_head
    final = attnres_mix(blocks + [partial], ck.get("model.output_attn_res_norm.weight"),
                        ck.get("model.output_attn_res_proj.weight"), eps)
    logits = None
    if ck.has("model.norm.weight") and ck.has("lm_head.weight"):
        logits = rmsnorm(final, ck.get("model.norm.weight"), eps) @ ck.get("lm_head.weight").T
    return final, logits


class CachedCheckpoint(Checkpoint):
    """Checkpoint with an in-memory tensor cache (the tiny fixture is re-run per decode step)."""

    def __init__(self, model_dir):
        super().__init__(model_dir)
        self._cache = {}

    def raw(self, name):
        if name not in self._cache:
            self._cache[name] = super().raw(name)
        return self._cache[name]

    def get(self, name):
        key = ("f64", name)
        if key not in self._cache:
            self._cache[key] = self.raw(name).astype(np.float64)
        return self._cache[key]


def parse_ids(s):
    return [int(t) for t in s.replace(",", " ").split()]


def cmd_trace(a):
    t0 = time.time()
    cfg = Cfg(a.model_dir)
    ck = CachedCheckpoint(a.model_dir) if a.cache else Checkpoint(a.model_dir)
    ids = parse_ids(a.ids)
    if a.layers is not None and not (1 <= a.layers <= cfg.L):
        sys.exit("--layers must be in 1..%d" % cfg.L)
    tr = {}
    final, logits = forward(cfg, ck, ids, a.layers, tr)
    out = {"prompt_ids": np.asarray(ids, dtype=np.int64)}
    if logits is not None:
        out["logits"] = logits
    out.update(tr)
    out["final_hidden"] = final
    if a.decode:
        if logits is None:
            sys.exit("--decode needs model.norm and lm_head")
        seq, dec_ids, dec_logits = list(ids), [], []
        row = logits[-1]
        for j in range(a.decode):
            # greedy: argmax (first index on ties); row j chose decode_ids[j]
            nxt = int(np.argmax(row))
            dec_ids.append(nxt)
            dec_logits.append(row)
            if j + 1 < a.decode:   # the last chosen id is never fed
                seq.append(nxt)
                _, lg = forward(cfg, ck, seq, a.layers)  # full re-run (no cache)
                row = lg[-1]
        out["decode_ids"] = np.asarray(dec_ids, dtype=np.int64)
        out["decode_logits"] = np.stack(dec_logits)
    conv = {}
    for kname, v in out.items():
        v = np.asarray(v)
        conv[kname] = v.astype(np.int64) if v.dtype.kind in "iu" else v.astype(np.float32)
    write_st_file(a.out, conv)
    print("k3_ref: %d tokens, %d layers, %d tensors -> %s (%.2f s)"
          % (len(ids), a.layers or cfg.L, len(conv), a.out, time.time() - t0))
    if a.decode:
        print("decode_ids:", ",".join(str(i) for i in out["decode_ids"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Kimi K3 float64 numpy reference")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace", help="teacher-forced forward, write a trace safetensors")
    t.add_argument("model_dir")
    t.add_argument("--ids", required=True, help="token ids, comma/space separated (nothing prepended)")
    t.add_argument("--out", required=True)
    t.add_argument("--decode", type=int, default=0, help="greedy decode N tokens (full re-run per step)")
    t.add_argument("--layers", type=int, default=None, help="run only the first N layers")
    t.add_argument("--no-cache", dest="cache", action="store_false",
                   help="do not keep weights in memory between decode steps")
    a = ap.parse_args(argv)
    if a.cmd == "trace":
        cmd_trace(a)


if __name__ == "__main__":
    main()
