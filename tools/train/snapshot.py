"""Hugging Face snapshot export and import for the tiny K3 (docs/tensor_names.md).

export(): the trained model -> the release's layout: config.json with the release's keys and
nesting (assets/k3-release/config.json, dimensions replaced), one shard per layer plus one for
the globals, each shard's tensors in the release's order (F32, then BF16, then U8; by name
inside a group), `language_model.` prefix, BF16 dense tensors, MXFP4 experts (U8 codes +
ue8m0 scales), the index, generation_config.json, tiktoken.model and tokenizer_config.json.

load(): a snapshot -> a full-vocabulary K3 in any float dtype, weights widened exactly
(BF16 -> f32 -> f64, MXFP4 dequantised exactly). The float64 oracle runs on what load()
returns, so it checks the export as well as the engine.
"""

import copy
import json
import os
import shutil
import struct

import numpy as np
import torch

import k3_torch

PREFIX = "language_model."
EXPERT_PARTS = (("w1", "gate"), ("w2", "down"), ("w3", "up"))
# Stored as F32 in the release's layout; every other dense tensor is BF16.
F32_SUFFIXES = ("conv1d.weight", "A_log", "dt_bias", "e_score_correction_bias", "o_norm.weight")


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def bf16_bits(a):
    """f32 array -> BF16 bit patterns (round to nearest even; no NaN in trained weights)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_round(t):
    """torch tensor -> the same values rounded through BF16 (as f32)."""
    bits = bf16_bits(t.detach().cpu().float().numpy()).astype(np.uint32) << 16
    return torch.from_numpy(bits.view(np.float32).copy())


def safetensors_bytes(tensors):
    """[(name, dtype, shape, raw bytes)] in data order -> the file's bytes."""
    header, off = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-(8 + len(h))) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, en = e["data_offsets"]
        raw = blob[8 + n + b:8 + n + en]
        if e["dtype"] == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif e["dtype"] == "F32":
            a = np.frombuffer(raw, "<f4")
        elif e["dtype"] == "U8":
            a = np.frombuffer(raw, np.uint8)
        else:
            raise ValueError("%s: tensor %s has dtype %s (expected BF16, F32 or U8)"
                             % (path, name, e["dtype"]))
        out[name] = a.reshape(e["shape"]).copy()
    return out


def make_config(cfg, release_dir):
    with open(os.path.join(release_dir, "config.json")) as f:
        root = json.load(f)
    text = root["text_config"]
    for key, value in cfg.items():
        if key == "linear_attn_config":
            text[key].update(copy.deepcopy(value))
        else:
            text[key] = value
    layers = cfg["num_hidden_layers"]
    kda = cfg["linear_attn_config"]["kda_layers"]
    text["linear_attn_config"]["full_attn_layers"] = [n for n in range(1, layers + 1) if n not in kda]
    text["num_key_value_heads"] = cfg["num_attention_heads"]
    root["vision_config"]["text_hidden_size"] = cfg["hidden_size"]
    return root


def full_vocab_tensors(model):
    """The embedding and lm_head at 163,840 rows (unused rows: zero / the shared row)."""
    V, D = model.cfg["vocab_size"], model.cfg["hidden_size"]
    emb = model.get("model.embed_tokens.weight").detach().float()
    head = model.get("lm_head.weight").detach().float()
    if model.vocab_ids is None:
        return emb, head
    idx = torch.tensor(model.vocab_ids, dtype=torch.long)
    full_emb = torch.zeros(V, D)
    full_emb[idx] = emb
    full_head = model.get("lm_head.never").detach().float().expand(V, D).clone()
    full_head[idx] = model.get("lm_head.rare").detach().float()
    full_head[torch.tensor(model.head_ids, dtype=torch.long)] = head
    return full_emb, full_head


def export(model, out_dir, release_dir, extra_files=()):
    """Write the snapshot into out_dir (built in out_dir.partial, then renamed)."""
    cfg = model.cfg
    L = cfg["num_hidden_layers"]
    shards = [[] for _ in range(L + 1)]  # one per layer, then the globals

    def add(shard, name, t):
        t = t.detach().cpu().float()
        if name.endswith(F32_SUFFIXES):
            shards[shard].append((PREFIX + name, "F32", t.shape, t.numpy().astype("<f4").tobytes()))
        else:
            shards[shard].append((PREFIX + name, "BF16", t.shape, bf16_bits(t.numpy()).tobytes()))

    emb, head = full_vocab_tensors(model)
    add(L, "model.embed_tokens.weight", emb)
    add(L, "lm_head.weight", head)
    for name, t in model.named_tensors():
        if name in ("model.embed_tokens.weight", "lm_head.weight", "lm_head.rare", "lm_head.never"):
            continue
        if not name.startswith("model.layers."):
            add(L, name, t)
            continue
        layer = int(name.split(".")[2])
        if ".experts.w" in name:
            base = name[: name.index(".experts.")] + ".experts."
            part = name[-2:]
            codes, exps = k3_torch.mxfp4_codes(t.detach().float())
            codes = codes.numpy()
            scales = (exps.numpy() + 127).astype(np.uint8)
            if scales.max() >= 255:
                raise ValueError("%s: MXFP4 exponent out of range" % name)
            packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
            for e in range(packed.shape[0]):
                p = "%s%d.%s." % (base, e, part)
                shards[layer].append((PREFIX + p + "weight_packed", "U8", packed[e].shape,
                                      packed[e].tobytes()))
                shards[layer].append((PREFIX + p + "weight_scale", "U8", scales[e].shape,
                                      scales[e].tobytes()))
            continue
        add(layer, name, t)

    order = {"F32": 0, "BF16": 1, "U8": 2}
    partial = out_dir.rstrip("/") + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    weight_map, total = {}, 0
    for k, tensors in enumerate(shards):
        tensors.sort(key=lambda t: (order[t[1]], t[0]))
        fname = "model-%05d-of-%06d.safetensors" % (k + 1, len(shards))
        write_atomic(os.path.join(partial, fname), safetensors_bytes(tensors))
        for t in tensors:
            weight_map[t[0]] = fname
            total += len(t[3])
    index = {"metadata": {"total_size": total},
             "weight_map": {k: weight_map[k] for k in sorted(weight_map)}}
    write_atomic(os.path.join(partial, "model.safetensors.index.json"),
                 (json.dumps(index, indent=2) + "\n").encode())
    gen = {"max_length": 1048576, "eos_token_id": 163586}
    write_atomic(os.path.join(partial, "generation_config.json"), (json.dumps(gen, indent=2) + "\n").encode())
    for f in ("tiktoken.model", "tokenizer_config.json"):
        with open(os.path.join(release_dir, f), "rb") as src:
            write_atomic(os.path.join(partial, f), src.read())
    for name, data in extra_files:
        write_atomic(os.path.join(partial, name), data)
    # config.json last: its presence marks a complete checkpoint.
    write_atomic(os.path.join(partial, "config.json"),
                 (json.dumps(make_config(cfg, release_dir), indent=2) + "\n").encode())
    old = out_dir.rstrip("/") + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(out_dir):
        os.replace(out_dir, old)
    os.replace(partial, out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return total


def read_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        root = json.load(f)
    text = root.get("text_config", root)
    cfg = k3_torch.default_config()
    for key in cfg:
        if key == "linear_attn_config":
            for k in cfg[key]:
                cfg[key][k] = text[key][k]
        else:
            cfg[key] = text[key]
    return cfg


def load(model_dir, dtype=torch.float64):
    """A snapshot -> K3 (full vocabulary, eval mode) with every weight widened exactly."""
    cfg = read_config(model_dir)
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for fname in files:
        tensors.update(read_safetensors(os.path.join(model_dir, fname)))
    model = K3Full(cfg)
    for name, t in model.named_tensors():
        if ".experts.w" in name:
            base = PREFIX + name[: name.index(".experts.")] + ".experts."
            part = name[-2:]
            rows = []
            for e in range(cfg["num_experts"]):
                packed = tensors[base + "%d.%s.weight_packed" % (e, part)]
                scale = tensors[base + "%d.%s.weight_scale" % (e, part)]
                codes = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
                codes[:, 0::2] = packed & 0x0F
                codes[:, 1::2] = packed >> 4
                exps = torch.from_numpy(scale.astype(np.int64) - 127)
                rows.append(k3_torch.mxfp4_dequant(torch.from_numpy(codes), exps, torch.float64))
            value = torch.stack(rows)
        else:
            value = torch.from_numpy(tensors[PREFIX + name].astype(np.float64))
        if tuple(value.shape) != tuple(t.shape):
            raise ValueError("%s: tensor %s has shape %s, expected %s"
                             % (model_dir, name, list(value.shape), list(t.shape)))
        with torch.no_grad():
            t.data = value.to(dtype)
    model.eval()
    return model


class K3Full(k3_torch.K3):
    """A full-vocabulary K3 whose weights load() fills (no random init cost worth keeping)."""

    def __init__(self, cfg):
        super().__init__(cfg, seed=0)
