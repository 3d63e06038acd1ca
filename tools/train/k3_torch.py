"""The Kimi K3 text model in PyTorch, for training a tiny one (tools/train/README.md).

Written from docs/architecture.md (the § numbers below are its sections) and
docs/quant_formats.md §1, not from any reference implementation. Every tensor is kept under its checkpoint name
(docs/tensor_names.md), so export is a rename-free walk; the only training-only tensors are
the stacked routed experts `...experts.w{1,2,3}` [E, out, in] and the shared lm_head row of
the tokens the corpus never uses (`lm_head.other`).

Shapes: activations are [B, T, D] (batch, time, hidden); matrices are nn.Linear W[out][in].

Equations (docs/architecture.md):
  RMSNorm(x, w, eps) = x / sqrt(mean(x^2) + eps) * w               docs/architecture.md §3.1
  AttnRes Mix(v_0..v_n; w) = sum_e softmax_e(dot(v_e, w) / rms(v_e)) v_e    docs/architecture.md §3.3
  KDA (per head): q, k, v = SiLU(conv4(W x)); q, k L2-normed (+1e-6), q *= dk^-1/2;
      a = exp(lower * sigmoid(exp(A_log[h]) * (Wfb Wfa x + dt_bias)));  beta = sigmoid(Wb x)
      S = diag(a) S;  S += k (beta (v - k^T S))^T;  o = S^T q;
      out = Wo concat_h(RMSNorm(o, o_norm) * sigmoid(Wg x))    docs/architecture.md §3.4
  MLA (NoPE, gated): cq = RMSNorm(Wqa x, 1e-6); [q_nope|q_pe] = Wqb cq;
      [c|kpe] = Wkva x, c = RMSNorm(c, 1e-6); k_nope = W_UK c, val = W_UV c;
      p = softmax((q_nope.k_nope + q_pe.kpe) / sqrt(nope + rope)), causal;
      out = Wo concat_h((sum p val) * sigmoid(Wg x))    docs/architecture.md §3.5
  SiTU(g, u) = [b1 tanh(g/b1) sigmoid(g)] [b2 tanh(u/b2)]    docs/architecture.md §3.6
  LatentMoE: s = sigmoid(Wr x); sel = topk(s + bias); w = s[sel] / sum s[sel];
      z = Wld x; acc = sum_j w_j W2_j SiTU(W1_j z, W3_j z)  (MXFP4 fake-quant);
      y = Wlu RMSNorm(acc) + Wsd SiTU(Wsg x, Wsu x)    docs/architecture.md §3.6
  Head: logits = lm_head RMSNorm(final_hidden, model.norm)    docs/architecture.md §3.8
"""

import math

import torch
import torch.nn.functional as F

# docs/architecture.md §1.2: constants that are not config keys.
MLA_LOW_RANK_NORM_EPS = 1e-6
KDA_L2_NORM_EPS = 1e-6

# docs/quant_formats.md §1: the e2m1 magnitudes and the rounding thresholds between them.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
MXFP4_GROUP = 32


def default_config():
    """The tiny model's dimensions (names as in config.json's text_config)."""
    layers = 8
    # The release's pattern: MLA at i % 4 == 3 and at the last layer, KDA elsewhere.
    kda = [i + 1 for i in range(layers) if not (i % 4 == 3 or i == layers - 1)]
    return {
        "hidden_size": 128,
        "num_hidden_layers": layers,
        "vocab_size": 163840,
        "rms_norm_eps": 1e-5,
        "first_k_dense_replace": 1,
        "intermediate_size": 384,
        "num_attention_heads": 4,
        "q_lora_rank": 64,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "num_experts": 32,
        "num_experts_per_token": 4,
        "moe_intermediate_size": 64,
        "routed_expert_hidden_size": 64,
        "num_shared_experts": 2,
        "routed_scaling_factor": 1.0,
        "attn_res_block_size": 3,
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "linear_attn_config": {
            "num_heads": 4,
            "head_dim": 32,
            "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0,
            "kda_layers": kda,
        },
    }


def is_kda(cfg, i):
    return (i + 1) in cfg["linear_attn_config"]["kda_layers"]


def is_dense(cfg, i):
    return i < cfg["first_k_dense_replace"]


# --------------------------------------------------------------------------------------------
# MXFP4 fake quantisation (docs/quant_formats.md §1): W = E2M1[code] * 2^(scale - 127).


def mxfp4_codes(w):
    """w [..., in] -> (codes uint8 [..., in], exponents int [..., in/32]) of the nearest MXFP4.

    Per group of 32 inputs the exponent e is the smallest with max|w| / 2^e <= 6, so nothing
    clips; each element then rounds to the nearest e2m1 magnitude (ties to the larger).
    """
    shape = w.shape
    g = w.reshape(*shape[:-1], shape[-1] // MXFP4_GROUP, MXFP4_GROUP)
    amax = g.abs().amax(dim=-1, keepdim=True)
    e = torch.ceil(torch.log2(torch.clamp(amax, min=2.0**-120) / 6.0))
    e = torch.clamp(e, -127, 127)
    y = g / torch.exp2(e)
    mag = torch.bucketize(y.abs(), torch.tensor(E2M1_THRESHOLDS, dtype=y.dtype), right=True)
    mag = torch.clamp(mag, max=7)
    sign = (y < 0) & (mag > 0)
    codes = (mag + 8 * sign.to(mag.dtype)).to(torch.uint8).reshape(shape)
    return codes, e.squeeze(-1).to(torch.int64)


def mxfp4_dequant(codes, exps, dtype):
    """Inverse of mxfp4_codes: exact values in `dtype`."""
    table = torch.tensor(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES), dtype=dtype)
    v = table[codes.long()]
    shape = v.shape
    v = v.reshape(*shape[:-1], shape[-1] // MXFP4_GROUP, MXFP4_GROUP)
    return (v * torch.exp2(exps.to(dtype)).unsqueeze(-1)).reshape(shape)


def mxfp4_fake_quant(w):
    """Straight-through estimator: the forward sees the MXFP4 grid, the gradient passes to w."""
    codes, exps = mxfp4_codes(w.detach())
    q = mxfp4_dequant(codes, exps, w.dtype)
    return w + (q - w).detach()


# --------------------------------------------------------------------------------------------
# Elementwise pieces.


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def situ(g, u, b1, b2):
    return (b1 * torch.tanh(g / b1) * torch.sigmoid(g)) * (b2 * torch.tanh(u / b2))


def attn_res_mix(sources, query, eps):
    """sources: list of [B, T, D]; query = res_norm * res_proj[0] [D] -> [B, T, D]."""
    v = torch.stack(sources, 0)  # [S, B, T, D]
    score = (v @ query) * torch.rsqrt(v.pow(2).mean(-1) + eps)  # [S, B, T]
    p = torch.softmax(score, 0)
    return (p.unsqueeze(-1) * v).sum(0)


def kda_recurrent(q, k, v, log_decay, beta):
    """The delta rule one token at a time (docs/architecture.md §3.4). [B, T, H, dk] -> [B, T, H, dk].

    S = diag(a_t) S;  u = beta_t (v_t - S^T k_t);  S += k_t u^T;  o_t = S^T q_t,  a = exp(log_decay).
    """
    B, T, H, dk = q.shape
    state = q.new_zeros(B, H, dk, v.shape[-1])  # S[key][value]
    outs = []
    # unbind once: indexing [:, t] in the loop would cost a full-size gradient per step
    steps = zip(torch.exp(log_decay).unbind(1), q.unbind(1), k.unbind(1), v.unbind(1), beta.unbind(1))
    for a_t, q_t, k_t, v_t, beta_t in steps:  # [B, H, dk] each, beta_t [B, H]
        state = a_t.unsqueeze(-1) * state
        pred = (k_t.unsqueeze(-1) * state).sum(-2)  # k^T S (a tiny bmm is slower)
        u = beta_t.unsqueeze(-1) * (v_t - pred)
        state = state + k_t.unsqueeze(-1) * u.unsqueeze(-2)
        outs.append((q_t.unsqueeze(-1) * state).sum(-2))  # S^T q
    return torch.stack(outs, 1)


def kda_chunked(q, k, v, log_decay, beta, chunk):
    """The same recurrence, `chunk` tokens at a time (training speed; equal up to rounding).

    Inside a chunk, with G_t = sum_{i<=t} log a_i per key channel (so every exponent below is
    <= 0) and S0 the state at the chunk's start, the writes u solve a unit lower-triangular
    system, and the outputs and the next state follow:
      u_i + sum_{j<i} beta_i (k_i . k_j e^{G_i - G_j}) u_j = beta_i (v_i - S0^T (k_i e^{G_i}))
      o_t = S0^T (q_t e^{G_t}) + sum_{i<=t} (q_t . k_i e^{G_t - G_i}) u_i
      S   = diag(e^{G_C}) S0 + sum_i (k_i e^{G_C - G_i}) u_i^T
    """
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    pad = (-T) % chunk
    if pad:  # padded steps decay nothing and write nothing (beta = 0), so they change nothing
        q, k, v, log_decay = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v, log_decay))
        beta = F.pad(beta, (0, 0, 0, pad))
    n = (T + pad) // chunk
    # [B, H, n, C, d]
    split = lambda t: t.reshape(B, n, chunk, H, -1).permute(0, 3, 1, 2, 4)  # noqa: E731
    q, k, v, G = split(q), split(k), split(v), split(log_decay).cumsum(3)
    beta = beta.reshape(B, n, chunk, H).permute(0, 3, 1, 2)  # [B, H, n, C]
    diff = G.unsqueeze(4) - G.unsqueeze(3)  # [B, H, n, C(t), C(i), dk] = G_t - G_i
    strict = torch.ones(chunk, chunk, dtype=torch.bool).tril(-1)
    incl = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    e_strict = torch.exp(diff.masked_fill(~strict.unsqueeze(-1), float("-inf")))
    e_incl = torch.exp(diff.masked_fill(~incl.unsqueeze(-1), float("-inf")))
    A = beta.unsqueeze(-1) * torch.einsum("bhntc,bhnic,bhntic->bhnti", k, k, e_strict)
    M = torch.einsum("bhntc,bhnic,bhntic->bhnti", q, k, e_incl)
    eye = torch.eye(chunk, dtype=q.dtype)
    kg, qg = k * torch.exp(G), q * torch.exp(G)
    k_to_end = k * torch.exp(G[:, :, :, -1:] - G)
    state = q.new_zeros(B, H, dk, dv)
    outs = []
    for c in range(n):
        rhs = beta[:, :, c].unsqueeze(-1) * (v[:, :, c] - kg[:, :, c] @ state)
        u = torch.linalg.solve_triangular(eye + A[:, :, c], rhs, upper=False, unitriangular=True)
        outs.append(qg[:, :, c] @ state + M[:, :, c] @ u)
        state = torch.exp(G[:, :, c, -1]).unsqueeze(-1) * state + k_to_end[:, :, c].transpose(-1, -2) @ u
    o = torch.stack(outs, 2)  # [B, H, n, C, dv]
    return o.permute(0, 2, 3, 1, 4).reshape(B, n * chunk, H, dv)[:, :T]


def layer_name(i, suffix):
    return "model.layers.%d.%s" % (i, suffix)


# --------------------------------------------------------------------------------------------


class K3(torch.nn.Module):
    """The K3 text model over a compact vocabulary.

    `embed_ids` lists the real token ids that get an embedding row (the ids the corpus uses,
    sorted); every other embedding row is zero. `head_ids` (a subset) get their own lm_head
    row. Of the remaining ids, the ones in `embed_ids` ("rare") share one lm_head row
    (`lm_head.rare`) and the ones never used share another (`lm_head.never`); a shared row's
    combined logit is row . h + log(count), so the training softmax over
    len(head_ids) + 2 classes equals the exported checkpoint's softmax over all 163,840 rows.
    With embed_ids = None every row is its own (an imported checkpoint).
    """

    def __init__(self, cfg, embed_ids=None, head_ids=None, seed=0):
        super().__init__()
        self.cfg = cfg
        full = cfg["vocab_size"]
        self.vocab_ids = None if embed_ids is None else list(embed_ids)
        self.head_ids = None if embed_ids is None else list(head_ids)
        self.rows = full if embed_ids is None else len(self.vocab_ids)
        self.head_rows = full if embed_ids is None else len(self.head_ids)
        self.rare_rows = 0 if embed_ids is None else self.rows - self.head_rows
        self.never_rows = 0 if embed_ids is None else full - self.rows
        self.params = torch.nn.ParameterDict()
        self.buffer_names = []
        self.dense_std = {}
        gen = torch.Generator().manual_seed(seed)
        self._build(gen)
        # KDA: chunk length of the parallel form (0 = one token at a time; both are exact).
        self.kda_chunk = 0
        # Routing load seen since the last bias update, per MoE layer [E].
        self.expert_load = {}

    # -- parameter table ----------------------------------------------------------------------

    def _p(self, name, shape, std=0.0, mean=0.0, gen=None, trainable=True, init=None):
        if init is not None:
            t = init
        else:
            t = torch.randn(*shape, generator=gen) * std + mean if std else torch.full(shape, mean)
        if trainable:
            self.params[name.replace(".", "/")] = torch.nn.Parameter(t.float())
        else:
            self.register_buffer(name.replace(".", "/"), t.float())
            self.buffer_names.append(name)

    def get(self, name):
        key = name.replace(".", "/")
        if key in self.params:
            return self.params[key]
        return getattr(self, key)

    def named_tensors(self):
        """(checkpoint name, tensor) for every parameter and buffer."""
        for key, p in self.params.items():
            yield key.replace("/", "."), p
        for name in self.buffer_names:
            yield name, getattr(self, name.replace(".", "/"))

    def _build(self, gen):
        c = self.cfg
        D = c["hidden_size"]
        L = c["num_hidden_layers"]
        la = c["linear_attn_config"]
        out_std = lambda fan_in: 1.0 / math.sqrt(fan_in) / math.sqrt(2 * L)  # noqa: E731
        in_std = lambda fan_in: 1.0 / math.sqrt(fan_in)  # noqa: E731
        self._p("model.embed_tokens.weight", (self.rows, D), 1.0, gen=gen)
        self._p("lm_head.weight", (self.head_rows, D), in_std(D), gen=gen)
        if self.vocab_ids is not None:
            self._p("lm_head.rare", (D,), 0.0)
            self._p("lm_head.never", (D,), 0.0)
        self._p("model.norm.weight", (D,), mean=1.0)
        self._p("model.output_attn_res_norm.weight", (D,), mean=1.0)
        self._p("model.output_attn_res_proj.weight", (1, D), 0.0)
        for i in range(L):
            n = lambda s: layer_name(i, s)  # noqa: E731
            for s in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm",
                      "mlp_res_norm"):
                self._p(n(s + ".weight"), (D,), mean=1.0)
            self._p(n("self_attention_res_proj.weight"), (1, D), 0.0)
            self._p(n("mlp_res_proj.weight"), (1, D), 0.0)
            if is_kda(c, i):
                H, dk, K = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
                P = H * dk
                for s in ("q_proj", "k_proj", "v_proj", "g_proj"):
                    self._p(n("self_attn.%s.weight" % s), (P, D), in_std(D), gen=gen)
                for s in ("q_conv1d", "k_conv1d", "v_conv1d"):
                    w = torch.randn(P, 1, K, generator=gen) * 0.1
                    w[:, 0, K - 1] += 1.0  # near the identity: the current token passes
                    self._p(n("self_attn.%s.weight" % s), None, init=w)
                self._p(n("self_attn.f_a_proj.weight"), (dk, D), in_std(D), gen=gen)
                self._p(n("self_attn.f_b_proj.weight"), (P, dk), 0.1 * in_std(dk), gen=gen)
                self._p(n("self_attn.b_proj.weight"), (H, D), in_std(D), gen=gen)
                a_log = torch.zeros(dk)  # entries past num_heads stay zero (padding)
                self._p(n("self_attn.A_log"), None, init=a_log)
                # Decays a = exp(-5 sigmoid(dt)) between ~0.99 and ~0.5 at the start.
                dt = torch.rand(P, generator=gen) * 4.0 - 6.0
                self._p(n("self_attn.dt_bias"), None, init=dt)
                self._p(n("self_attn.o_norm.weight"), (dk,), mean=1.0)
                self._p(n("self_attn.o_proj.weight"), (D, P), out_std(P), gen=gen)
            else:
                H = c["num_attention_heads"]
                qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
                qr, kvr = c["q_lora_rank"], c["kv_lora_rank"]
                vd = c["v_head_dim"]
                self._p(n("self_attn.q_a_proj.weight"), (qr, D), in_std(D), gen=gen)
                self._p(n("self_attn.q_a_layernorm.weight"), (qr,), mean=1.0)
                self._p(n("self_attn.q_b_proj.weight"), (H * qk, qr), in_std(qr), gen=gen)
                self._p(n("self_attn.kv_a_proj_with_mqa.weight"), (kvr + c["qk_rope_head_dim"], D),
                        in_std(D), gen=gen)
                self._p(n("self_attn.kv_a_layernorm.weight"), (kvr,), mean=1.0)
                self._p(n("self_attn.kv_b_proj.weight"), (H * (c["qk_nope_head_dim"] + vd), kvr),
                        in_std(kvr), gen=gen)
                self._p(n("self_attn.g_proj.weight"), (H * vd, D), in_std(D), gen=gen)
                self._p(n("self_attn.o_proj.weight"), (D, H * vd), out_std(H * vd), gen=gen)
            if is_dense(c, i):
                inter = c["intermediate_size"]
                self._p(n("mlp.gate_proj.weight"), (inter, D), in_std(D), gen=gen)
                self._p(n("mlp.up_proj.weight"), (inter, D), in_std(D), gen=gen)
                self._p(n("mlp.down_proj.weight"), (D, inter), out_std(inter), gen=gen)
            else:
                E, R, Fi = c["num_experts"], c["routed_expert_hidden_size"], c["moe_intermediate_size"]
                S = c["num_shared_experts"] * Fi
                m = lambda s: n("block_sparse_moe." + s)  # noqa: E731
                self._p(m("gate.weight"), (E, D), 0.02, gen=gen)
                self._p(m("gate.e_score_correction_bias"), (E,), 0.0, trainable=False)
                self._p(m("routed_expert_down_proj.weight"), (R, D), in_std(D), gen=gen)
                self._p(m("routed_expert_norm.weight"), (R,), mean=1.0)
                self._p(m("routed_expert_up_proj.weight"), (D, R), out_std(R), gen=gen)
                self._p(m("shared_experts.gate_proj.weight"), (S, D), in_std(D), gen=gen)
                self._p(m("shared_experts.up_proj.weight"), (S, D), in_std(D), gen=gen)
                self._p(m("shared_experts.down_proj.weight"), (D, S), out_std(S), gen=gen)
                self._p(m("experts.w1"), (E, Fi, R), in_std(R), gen=gen)  # gate
                self._p(m("experts.w3"), (E, Fi, R), in_std(R), gen=gen)  # up
                self._p(m("experts.w2"), (E, R, Fi), in_std(Fi), gen=gen)  # down

    # -- layers ---------------------------------------------------------------------------------

    def _query(self, norm, proj):
        return self.get(norm) * self.get(proj)[0]

    def _kda(self, i, x):
        c, la = self.cfg, self.cfg["linear_attn_config"]
        g = lambda s: self.get(layer_name(i, "self_attn." + s))  # noqa: E731
        B, T, _ = x.shape
        H, dk, K = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
        P = H * dk

        def conv(name, s):  # causal depthwise conv, tap K-1 = the current token, then SiLU
            y = F.conv1d(F.pad(s.transpose(1, 2), (K - 1, 0)), g(name + ".weight"), groups=P)
            return F.silu(y.transpose(1, 2))

        q = conv("q_conv1d", x @ g("q_proj.weight").t()).reshape(B, T, H, dk)
        k = conv("k_conv1d", x @ g("k_proj.weight").t()).reshape(B, T, H, dk)
        v = conv("v_conv1d", x @ g("v_proj.weight").t()).reshape(B, T, H, dk)
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + KDA_L2_NORM_EPS) * dk**-0.5
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + KDA_L2_NORM_EPS)
        graw = (x @ g("f_a_proj.weight").t()) @ g("f_b_proj.weight").t() + g("dt_bias")
        a_exp = torch.exp(g("A_log")[:H]).reshape(1, 1, H, 1)
        beta = torch.sigmoid(x @ g("b_proj.weight").t())  # [B, T, H]
        log_decay = la["gate_lower_bound"] * torch.sigmoid(a_exp * graw.reshape(B, T, H, dk))
        if self.kda_chunk:
            o = kda_chunked(q, k, v, log_decay, beta, self.kda_chunk)
        else:
            o = kda_recurrent(q, k, v, log_decay, beta)
        o = rms_norm(o, g("o_norm.weight"), c["rms_norm_eps"])
        o = o * torch.sigmoid(x @ g("g_proj.weight").t()).reshape(B, T, H, dk)
        return o.reshape(B, T, P) @ g("o_proj.weight").t()

    def _mla(self, i, x):
        c = self.cfg
        g = lambda s: self.get(layer_name(i, "self_attn." + s))  # noqa: E731
        B, T, _ = x.shape
        H, dn, dr, dv, kvr = (c["num_attention_heads"], c["qk_nope_head_dim"],
                              c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"])
        cq = rms_norm(x @ g("q_a_proj.weight").t(), g("q_a_layernorm.weight"), MLA_LOW_RANK_NORM_EPS)
        q = (cq @ g("q_b_proj.weight").t()).reshape(B, T, H, dn + dr)
        ckv = x @ g("kv_a_proj_with_mqa.weight").t()
        latent = rms_norm(ckv[..., :kvr], g("kv_a_layernorm.weight"), MLA_LOW_RANK_NORM_EPS)
        kpe = ckv[..., kvr:]  # [B, T, dr], shared by the heads, never rotated
        kvb = g("kv_b_proj.weight").reshape(H, dn + dv, kvr)
        k_nope = torch.einsum("btc,hoc->bhto", latent, kvb[:, :dn])
        val = torch.einsum("btc,hoc->bhto", latent, kvb[:, dn:])
        qh = q.transpose(1, 2)  # [B, H, T, dn + dr]
        score = (qh[..., :dn] @ k_nope.transpose(-1, -2)
                 + qh[..., dn:] @ kpe.unsqueeze(1).transpose(-1, -2)) / math.sqrt(dn + dr)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        score = score.masked_fill(~mask, float("-inf"))
        ctx = (torch.softmax(score, -1) @ val).transpose(1, 2)  # [B, T, H, dv]
        ctx = ctx * torch.sigmoid(x @ g("g_proj.weight").t()).reshape(B, T, H, dv)
        return ctx.reshape(B, T, H * dv) @ g("o_proj.weight").t()

    def _mlp(self, prefix, x):
        c = self.cfg
        g = lambda s: self.get(prefix + s + ".weight")  # noqa: E731
        h = situ(x @ g("gate_proj").t(), x @ g("up_proj").t(),
                 c["activation_situ_beta"], c["activation_situ_linear_beta"])
        return h @ g("down_proj").t()

    def _moe(self, i, x, routing=None):
        c = self.cfg
        g = lambda s: self.get(layer_name(i, "block_sparse_moe." + s))  # noqa: E731
        B, T, D = x.shape
        E, top = c["num_experts"], c["num_experts_per_token"]
        xf = x.reshape(B * T, D)
        scores = torch.sigmoid(xf @ g("gate.weight").t())  # [N, E]
        choice = (scores + g("gate.e_score_correction_bias")).detach()
        # Ties go to the lower expert id (a stable sort), as in the engine.
        order = torch.sort(-choice, dim=-1, stable=True).indices
        ids = order[:, :top]  # [N, top]
        w = scores.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * c["routed_scaling_factor"]
        if routing is not None:
            sorted_choice = -torch.sort(-choice, dim=-1).values
            routing.append((ids.detach(), (sorted_choice[:, top - 1] - sorted_choice[:, top]).detach()))
        if self.training:
            load = torch.bincount(ids.reshape(-1), minlength=E).to(torch.float64)
            self.expert_load[i] = self.expert_load.get(i, 0) + load
        z = xf @ g("routed_expert_down_proj.weight").t()  # [N, R]
        w1 = mxfp4_fake_quant(g("experts.w1"))
        w2 = mxfp4_fake_quant(g("experts.w2"))
        w3 = mxfp4_fake_quant(g("experts.w3"))
        acc = torch.zeros_like(z)
        b1, b2 = c["activation_situ_beta"], c["activation_situ_linear_beta"]
        # Ascending expert id, like the engine (docs/architecture.md §3.6).
        for e in torch.unique(ids).tolist():
            rows, slot = torch.nonzero(ids == e, as_tuple=True)
            ze = z[rows]
            ye = situ(ze @ w1[e].t(), ze @ w3[e].t(), b1, b2) @ w2[e].t()
            acc = acc.index_add(0, rows, w[rows, slot].unsqueeze(-1) * ye)
        y = rms_norm(acc, g("routed_expert_norm.weight"), c["rms_norm_eps"])
        y = y @ g("routed_expert_up_proj.weight").t()
        y = y + self._mlp(layer_name(i, "block_sparse_moe.shared_experts."), xf)
        return y.reshape(B, T, D)

    # -- the walk (docs/architecture.md §3.3) --------------------------------------------------------

    def hidden(self, ids, routing=None):
        """ids [B, T] (row indices) -> final_hidden [B, T, D] (the output mix)."""
        c = self.cfg
        eps = c["rms_norm_eps"]
        block = c["attn_res_block_size"]
        partial = F.embedding(ids, self.get("model.embed_tokens.weight"))
        blocks = []
        for i in range(c["num_hidden_layers"]):
            n = lambda s: layer_name(i, s)  # noqa: E731
            if blocks:
                a_in = attn_res_mix(blocks + [partial],
                                    self._query(n("self_attention_res_norm.weight"),
                                                n("self_attention_res_proj.weight")), eps)
            else:
                a_in = partial
            start = i % block == 0
            if start:
                blocks.append(partial)
            x = rms_norm(a_in, self.get(n("input_layernorm.weight")), eps)
            att = self._kda(i, x) if is_kda(c, i) else self._mla(i, x)
            partial = att if start else partial + att
            m_in = attn_res_mix(blocks + [partial],
                                self._query(n("mlp_res_norm.weight"), n("mlp_res_proj.weight")), eps)
            xm = rms_norm(m_in, self.get(n("post_attention_layernorm.weight")), eps)
            if is_dense(c, i):
                partial = partial + self._mlp(n("mlp."), xm)
            else:
                partial = partial + self._moe(i, xm, routing)
        return attn_res_mix(blocks + [partial],
                            self._query("model.output_attn_res_norm.weight",
                                        "model.output_attn_res_proj.weight"), eps)

    def logits(self, hidden):
        """[.., D] -> [.., head rows (+2)]: then the rare and the never-used ids' combined logits."""
        h = rms_norm(hidden, self.get("model.norm.weight"), self.cfg["rms_norm_eps"])
        out = h @ self.get("lm_head.weight").t()
        if self.vocab_ids is not None:
            shared = [h @ self.get("lm_head.rare") + math.log(max(self.rare_rows, 1)),
                      h @ self.get("lm_head.never") + math.log(max(self.never_rows, 1))]
            out = torch.cat([out] + [t.unsqueeze(-1) for t in shared], -1)
        return out

    # -- the router's bias, updated without an auxiliary loss --------------------------------

    @torch.no_grad()
    def update_router_bias(self, rate):
        """noaux_tc: raise the bias of under-loaded experts, lower over-loaded ones."""
        for i, load in self.expert_load.items():
            bias = self.get(layer_name(i, "block_sparse_moe.gate.e_score_correction_bias"))
            bias += rate * torch.sign(load.mean() - load).to(bias.dtype)
        self.expert_load = {}
