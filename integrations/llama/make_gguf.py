#!/usr/bin/python3
"""Write a GGUF (v3) model with random weights: llama, gemma2, mamba or lfm2.

Tests and benchmarks of the llama.cpp integration need real model files that
llama.cpp loads and runs, yet nothing may be downloaded here and the `gguf`
pip package is not available.  This module is a small GGUF v3 writer of our
own: it needs only the Python standard library and numpy, so it runs with
Debian's /usr/bin/python3 (apt package python3-numpy).

The default model is a plain llama (RMS norm, RoPE, GQA attention, SwiGLU FFN);
the other architectures cover llama.cpp's other memories: gemma2 (interleaved
sliding-window attention: every other layer sees only the last `swa` tokens),
mamba (recurrent layers only: a state-space model) and lfm2 (a hybrid of
short-convolution recurrent layers and attention layers).  Every model has a
tiny SentencePiece-style ("llama") vocabulary: <unk> <s> </s>, the 256 byte
tokens <0x00>..<0xFF> (so any text tokenizes via byte fallback), then a few
dozen "▁"-prefixed word pieces.  Weights are drawn from
numpy.random.default_rng(seed) in a fixed order, so the same arguments give a
byte-identical file and a different seed gives different weights.

Format facts (checked against llama.cpp's ggml/src/gguf.cpp, src/llama-arch.cpp,
src/llama-model.cpp, src/models/{llama,gemma2,mamba,lfm2}.cpp and src/llama-vocab.cpp):
  * header: "GGUF", u32 version, u64 tensor_count, u64 kv_count, all little
    endian; strings are u64 length + UTF-8 bytes (no terminator).
  * a kv is key string, u32 value type, value; an array value is u32 element
    type, u64 count, elements.  llama.cpp checks value types strictly
    (e.g. hyperparameters must be UINT32, rope/eps FLOAT32, add_bos BOOL).
  * a tensor info is name, u32 n_dims, u64 ne[n_dims] (ne[0] is the innermost
    dimension, i.e. a numpy array of shape (ne[1], ne[0])), u32 ggml type,
    u64 offset into the data section.  The reader requires every offset to
    equal the sum of the previous tensors' sizes, each padded to
    general.alignment, and the data section to start aligned in the file.

  * gemma2 takes the output projection from token_embd (no output.weight) and
    norms after attention and FFN (post_attention_norm, post_ffw_norm); its
    sliding window is gemma2.attention.sliding_window, on layers 0, 2, 4, ...
  * mamba needs d_inner = 2 * n_embd; ssm_a and ssm_d have no ".weight"
    suffix; A is negative (a decaying state), so long prompts stay finite.
  * lfm2's layers are recurrent where lfm2.attention.head_count_kv (a per-layer
    array) is 0; its final norm is named token_embd_norm; with
    lfm2.attention.sliding_window its attention layers are windowed (llama.cpp
    then keeps a hybrid-iSWA memory).

Usage:
  /usr/bin/python3 integrations/llama/make_gguf.py --preset tiny --seed 1 --out tiny.gguf
  /usr/bin/python3 integrations/llama/make_gguf.py --preset medium --seed 1 --out medium.gguf
  /usr/bin/python3 integrations/llama/make_gguf.py --preset gemma2-tiny --seed 1 --out g.gguf

From Python:
  from make_gguf import write_model
  info = write_model("/tmp/m.gguf", preset="tiny", seed=3, layers=4)
"""

import argparse
import os
import struct
import sys

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT; also written as general.alignment

# gguf value types (enum gguf_type in gguf.h)
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, \
    T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(13)

# ggml tensor types (enum ggml_type) and the numpy dtype stored for each
GGML_F32, GGML_F16 = 0, 1
WEIGHT_TYPES = {"f32": (GGML_F32, np.dtype("<f4")), "f16": (GGML_F16, np.dtype("<f2"))}
# general.file_type (enum llama_ftype): ALL_F32 = 0, MOSTLY_F16 = 1
FILE_TYPE = {"f32": 0, "f16": 1}

# llama_token_type values stored in tokenizer.ggml.token_type
TOK_NORMAL, TOK_UNKNOWN, TOK_CONTROL, TOK_BYTE = 1, 2, 3, 6

_BASE = dict(arch="llama", swa=0, d_state=16, d_conv=4, dt_rank=4, l_cache=3, attn_every=2)
PRESETS = {
    # smallest useful GQA model: loads in milliseconds, for unit tests
    # (head dim 32: the smallest a quantized q8_0 K cache accepts, whose blocks are 32 wide)
    "tiny": dict(_BASE, layers=2, embd=64, heads=2, kv_heads=1, ff=128, ctx=4096, wtype="f32"),
    # ~24M parameters, 4:1 GQA: big enough for KV-cache traffic to matter
    "medium": dict(_BASE, layers=8, embd=512, heads=8, kv_heads=2, ff=1536, ctx=8192,
                   wtype="f16"),
    # Llama-3.2-1B's shapes (16 layers, 2048 wide, 32 heads, 8 KV heads of 64, feed-forward 8192;
    # ~1B parameters, 32 KiB of f16 KV per token) with random weights and this file's small vocab:
    # what a model people run costs per token, for the llama bench
    "llama-1b": dict(_BASE, layers=16, embd=2048, heads=32, kv_heads=8, ff=8192, ctx=8192,
                     wtype="f16"),
    # sliding-window attention on every other layer (window 128), full attention between
    "gemma2-tiny": dict(_BASE, arch="gemma2", layers=4, embd=64, heads=2, kv_heads=1, ff=128,
                        ctx=8192, swa=128, wtype="f32"),
    # heads of 256, as Gemma 2's (llama.cpp's CUDA flash attention, with Gemma 2's logit
    # soft-capping, has kernels for heads of 128 and 256 only)
    "gemma2-medium": dict(_BASE, arch="gemma2", layers=8, embd=512, heads=2, kv_heads=1,
                          ff=1536, ctx=8192, swa=512, wtype="f16"),
    # recurrent only: a state-space model (d_inner = 2 * embd)
    "mamba-tiny": dict(_BASE, arch="mamba", layers=2, embd=64, heads=0, kv_heads=0, ff=0,
                       ctx=8192, wtype="f32"),
    "mamba-medium": dict(_BASE, arch="mamba", layers=8, embd=512, heads=0, kv_heads=0, ff=0,
                         ctx=8192, wtype="f16"),
    # hybrid: short-convolution layers, every second layer attention
    "lfm2-tiny": dict(_BASE, arch="lfm2", layers=4, embd=64, heads=2, kv_heads=1, ff=128,
                      ctx=8192, wtype="f32"),
    "lfm2-medium": dict(_BASE, arch="lfm2", layers=8, embd=512, heads=8, kv_heads=2, ff=1536,
                        ctx=8192, wtype="f16"),
    # the same hybrid whose attention layers see a sliding window of 128 (hybrid-iSWA memory)
    "lfm2-swa-tiny": dict(_BASE, arch="lfm2", layers=4, embd=64, heads=2, kv_heads=1, ff=128,
                          ctx=8192, swa=128, wtype="f32"),
}

ROPE_FREQ_BASE = 10000.0
RMS_EPS = 1e-5

# Words with every "▁"-prefixed prefix in the vocab: SPM merges adjacent
# symbols only when the merged text is itself a token, so "▁cache" is reached
# through ▁c, ▁ca, ▁cac, ▁cach.  Anything else falls back to single letters or
# byte tokens.
WORDS = ["the", "a", "kv", "cache", "tier", "llama", "token", "hello",
         "world", "model", "key", "value", "block", "page", "hit", "miss"]
SPACE = "\u2581"  # "▁", SentencePiece's word-boundary marker


def build_vocab():
    """Return (tokens, scores, token_types) for the SPM-style vocabulary."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TOK_UNKNOWN, TOK_CONTROL, TOK_CONTROL]
    # byte fallback tokens; llama.cpp looks them up as "<0x%02X>"
    tokens += ["<0x%02X>" % b for b in range(256)]
    types += [TOK_BYTE] * 256

    pieces = [SPACE]
    for w in WORDS:
        pieces += [SPACE + w[:n] for n in range(1, len(w) + 1)]
    pieces += [SPACE + c for c in "abcdefghijklmnopqrstuvwxyz"]
    pieces += list("abcdefghijklmnopqrstuvwxyz")
    pieces = list(dict.fromkeys(pieces))  # dedupe, keep first occurrence
    tokens += pieces
    types += [TOK_NORMAL] * len(pieces)

    # Special and byte tokens score 0 (never merged); normal pieces descend so
    # earlier (more "frequent") pieces win merge ties, as in real SPM vocabs.
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


class _Writer:
    """Little-endian GGUF primitives over a binary file object."""

    def __init__(self, f):
        self.f = f

    def pack(self, fmt, *vals):
        self.f.write(struct.pack("<" + fmt, *vals))

    def string(self, s):
        b = s.encode("utf-8")
        self.pack("Q", len(b))
        self.f.write(b)

    def kv(self, key, vtype, value, elem_type=None):
        self.string(key)
        self.pack("I", vtype)
        if vtype == T_ARRAY:
            self.pack("IQ", elem_type, len(value))
            if elem_type == T_STRING:
                for s in value:
                    self.string(s)
            else:
                fmt = {T_INT32: "<i4", T_FLOAT32: "<f4"}[elem_type]
                self.f.write(np.asarray(value, dtype=fmt).tobytes())
        elif vtype == T_STRING:
            self.string(value)
        else:
            self.pack({T_UINT32: "I", T_INT32: "i", T_FLOAT32: "f", T_BOOL: "?"}[vtype], value)

    def pad(self):
        pos = self.f.tell()
        self.f.write(b"\0" * (-pos % ALIGNMENT))


def _is_attention_layer(h, i):
    """lfm2: which layers are attention (the others short convolutions)."""
    return i % h["attn_every"] == h["attn_every"] - 1


def _tensor_specs(h, n_vocab):
    """(name, ne, kind) for every tensor, in file order; kind is "norm", "ssm_a",
    "ssm_d", "ssm_dt_b" or "" (a matrix).

    ne follows llama.cpp's create_tensor() shapes in src/models/<arch>.cpp,
    innermost dimension first.
    """
    arch = h["arch"]
    if arch == "gemma2":
        return _gemma2_specs(h, n_vocab)
    if arch == "mamba":
        return _mamba_specs(h, n_vocab)
    if arch == "lfm2":
        return _lfm2_specs(h, n_vocab)
    n_embd, n_ff = h["embd"], h["ff"]
    head_dim = n_embd // h["heads"]
    n_q, n_kv = head_dim * h["heads"], head_dim * h["kv_heads"]
    specs = [("token_embd.weight", (n_embd, n_vocab), False)]
    for i in range(h["layers"]):
        p = "blk.%d." % i
        specs += [
            (p + "attn_norm.weight", (n_embd,), True),
            (p + "attn_q.weight", (n_embd, n_q), False),
            (p + "attn_k.weight", (n_embd, n_kv), False),
            (p + "attn_v.weight", (n_embd, n_kv), False),
            (p + "attn_output.weight", (n_q, n_embd), False),
            (p + "ffn_norm.weight", (n_embd,), True),
            (p + "ffn_gate.weight", (n_embd, n_ff), False),
            (p + "ffn_up.weight", (n_embd, n_ff), False),
            (p + "ffn_down.weight", (n_ff, n_embd), False),
        ]
    specs += [("output_norm.weight", (n_embd,), True),
              ("output.weight", (n_embd, n_vocab), False)]
    return [(n, ne, "norm" if norm else "") for n, ne, norm in specs]


def _attention_specs(p, n_embd, n_q, n_kv):
    return [(p + "attn_q.weight", (n_embd, n_q), ""),
            (p + "attn_k.weight", (n_embd, n_kv), ""),
            (p + "attn_v.weight", (n_embd, n_kv), ""),
            (p + "attn_output.weight", (n_q, n_embd), "")]


def _ffn_specs(p, n_embd, n_ff):
    return [(p + "ffn_gate.weight", (n_embd, n_ff), ""),
            (p + "ffn_up.weight", (n_embd, n_ff), ""),
            (p + "ffn_down.weight", (n_ff, n_embd), "")]


def _gemma2_specs(h, n_vocab):
    n_embd, n_ff = h["embd"], h["ff"]
    head_dim = n_embd // h["heads"]
    n_q, n_kv = head_dim * h["heads"], head_dim * h["kv_heads"]
    specs = [("token_embd.weight", (n_embd, n_vocab), "")]
    for i in range(h["layers"]):
        p = "blk.%d." % i
        specs += [(p + "attn_norm.weight", (n_embd,), "norm")]
        specs += _attention_specs(p, n_embd, n_q, n_kv)
        specs += [(p + "post_attention_norm.weight", (n_embd,), "norm"),
                  (p + "ffn_norm.weight", (n_embd,), "norm")]
        specs += _ffn_specs(p, n_embd, n_ff)
        specs += [(p + "post_ffw_norm.weight", (n_embd,), "norm")]
    specs += [("output_norm.weight", (n_embd,), "norm")]
    return specs


def _mamba_specs(h, n_vocab):
    n_embd = h["embd"]
    d_inner, d_state, d_conv, dt_rank = 2 * n_embd, h["d_state"], h["d_conv"], h["dt_rank"]
    specs = [("token_embd.weight", (n_embd, n_vocab), "")]
    for i in range(h["layers"]):
        p = "blk.%d." % i
        specs += [(p + "attn_norm.weight", (n_embd,), "norm"),
                  (p + "ssm_in.weight", (n_embd, 2 * d_inner), ""),
                  (p + "ssm_conv1d.weight", (d_conv, d_inner), ""),
                  (p + "ssm_conv1d.bias", (d_inner,), "bias"),
                  (p + "ssm_x.weight", (d_inner, dt_rank + 2 * d_state), ""),
                  (p + "ssm_dt.weight", (dt_rank, d_inner), ""),
                  (p + "ssm_dt.bias", (d_inner,), "ssm_dt_b"),
                  (p + "ssm_a", (d_state, d_inner), "ssm_a"),
                  (p + "ssm_d", (d_inner,), "ssm_d"),
                  (p + "ssm_out.weight", (d_inner, n_embd), "")]
    specs += [("output_norm.weight", (n_embd,), "norm"),
              ("output.weight", (n_embd, n_vocab), "")]
    return specs


def _lfm2_specs(h, n_vocab):
    n_embd, n_ff = h["embd"], h["ff"]
    head_dim = n_embd // h["heads"]
    n_kv = head_dim * h["kv_heads"]
    specs = [("token_embd.weight", (n_embd, n_vocab), ""),
             ("token_embd_norm.weight", (n_embd,), "norm")]
    for i in range(h["layers"]):
        p = "blk.%d." % i
        specs += [(p + "ffn_norm.weight", (n_embd,), "norm")]
        specs += _ffn_specs(p, n_embd, n_ff)
        specs += [(p + "attn_norm.weight", (n_embd,), "norm")]
        if _is_attention_layer(h, i):
            specs += [(p + "attn_q_norm.weight", (head_dim,), "norm"),
                      (p + "attn_k_norm.weight", (head_dim,), "norm")]
            specs += _attention_specs(p, n_embd, n_embd, n_kv)
        else:
            specs += [(p + "shortconv.conv.weight", (h["l_cache"], n_embd), ""),
                      (p + "shortconv.in_proj.weight", (n_embd, 3 * n_embd), ""),
                      (p + "shortconv.out_proj.weight", (n_embd, n_embd), "")]
    return specs


def _random_tensor(rng, name, ne, kind):
    """Draw one tensor as float32 with numpy shape reversed(ne)."""
    shape = tuple(reversed(ne))
    if kind == "ssm_a":
        # A = -exp(A_log) in the original: negative, so the state decays
        return -(1.0 + rng.random(shape, dtype=np.float32) * 7.0).astype(np.float32)
    if kind == "ssm_d":
        return np.ones(shape, dtype=np.float32)
    if kind == "ssm_dt_b":
        # softplus(dt) around 0.01..0.1: a step of a stable discretisation
        return (-4.0 + rng.random(shape, dtype=np.float32) * 2.0).astype(np.float32)
    if kind == "bias":
        return (0.01 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    is_norm = kind == "norm"
    if is_norm:
        # RMS-norm gains near 1 (the noise just makes seeds visible everywhere)
        return 1.0 + 0.01 * rng.standard_normal(shape, dtype=np.float32)
    # Embedding rows feed an RMS norm, so their scale hardly matters; for the
    # projections 1/sqrt(fan_in) keeps every activation (and the logits)
    # around unit variance, so outputs stay finite and non-degenerate.
    std = 0.02 if name == "token_embd.weight" else 1.0 / np.sqrt(ne[0])
    return (std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)


def resolve_hparams(preset="tiny", **overrides):
    """Preset values with non-None overrides applied, validated."""
    if preset not in PRESETS:
        raise ValueError("unknown preset %r (choose from %s)" % (preset, ", ".join(PRESETS)))
    h = dict(PRESETS[preset])
    for k, v in overrides.items():
        if k not in h:
            raise TypeError("unknown override %r" % k)
        if v is not None:
            h[k] = v
    if h["wtype"] not in WEIGHT_TYPES:
        raise ValueError("weight type must be f32 or f16")
    attention = h["arch"] != "mamba"
    for k in ("layers", "embd", "ctx") + (("heads", "kv_heads", "ff") if attention else ()):
        if int(h[k]) <= 0:
            raise ValueError("%s must be positive" % k)
    if attention:
        if h["embd"] % h["heads"] or h["heads"] % h["kv_heads"]:
            raise ValueError("embd must be a multiple of heads and heads of kv_heads")
        if (h["embd"] // h["heads"]) % 2:
            raise ValueError("head dimension must be even for RoPE")
    if h["arch"] == "gemma2" and h["swa"] <= 0:
        raise ValueError("gemma2 needs a sliding window (swa)")
    return h


def write_model(path, preset="tiny", seed=0, wtype=None, name=None, **overrides):
    """Write a random-weight GGUF of the preset's architecture to `path`; return a
    summary dict.

    overrides: layers, embd, heads, kv_heads, ff, ctx, swa (None keeps the preset).
    wtype: "f32" or "f16" for the matrices (norms are always f32); None keeps
    the preset's default.  The file is written to a temporary name and renamed,
    so concurrent readers never see a half-written model.
    """
    h = resolve_hparams(preset, wtype=wtype, **overrides)
    wname = h["wtype"]
    w_ggml, w_dtype = WEIGHT_TYPES[wname]
    tokens, scores, types = build_vocab()
    specs = _tensor_specs(h, len(tokens))
    model_name = name or "kvtier-random-%s-seed%d" % (preset, seed)

    arch = h["arch"]
    kvs = [
        ("general.architecture", T_STRING, arch),
        ("general.name", T_STRING, model_name),
        ("general.alignment", T_UINT32, ALIGNMENT),
        ("general.file_type", T_UINT32, FILE_TYPE[wname]),
        (arch + ".context_length", T_UINT32, h["ctx"]),
        (arch + ".embedding_length", T_UINT32, h["embd"]),
        (arch + ".block_count", T_UINT32, h["layers"]),
    ]
    if arch == "mamba":
        kvs += [
            ("mamba.ssm.conv_kernel", T_UINT32, h["d_conv"]),
            ("mamba.ssm.inner_size", T_UINT32, 2 * h["embd"]),
            ("mamba.ssm.state_size", T_UINT32, h["d_state"]),
            ("mamba.ssm.time_step_rank", T_UINT32, h["dt_rank"]),
        ]
    else:
        kvs += [
            (arch + ".feed_forward_length", T_UINT32, h["ff"]),
            (arch + ".attention.head_count", T_UINT32, h["heads"]),
        ]
        if arch == "lfm2":
            # per layer: 0 marks a recurrent (short-convolution) layer
            kvs += [("lfm2.attention.head_count_kv", T_ARRAY,
                     [h["kv_heads"] if _is_attention_layer(h, i) else 0
                      for i in range(h["layers"])], T_INT32),
                    ("lfm2.shortconv.l_cache", T_UINT32, h["l_cache"])]
            if h["swa"] > 0:
                kvs += [("lfm2.attention.sliding_window", T_UINT32, h["swa"])]
        else:
            kvs += [(arch + ".attention.head_count_kv", T_UINT32, h["kv_heads"])]
        # llama.cpp rejects a llama model whose n_rot differs from head_dim
        kvs += [(arch + ".rope.dimension_count", T_UINT32, h["embd"] // h["heads"]),
                (arch + ".rope.freq_base", T_FLOAT32, ROPE_FREQ_BASE)]
        if arch == "gemma2":
            kvs += [("gemma2.attention.sliding_window", T_UINT32, h["swa"])]
    kvs += [
        (arch + ".attention.layer_norm_rms_epsilon", T_FLOAT32, RMS_EPS),
        ("tokenizer.ggml.model", T_STRING, "llama"),
        ("tokenizer.ggml.tokens", T_ARRAY, tokens, T_STRING),
        ("tokenizer.ggml.scores", T_ARRAY, scores, T_FLOAT32),
        ("tokenizer.ggml.token_type", T_ARRAY, types, T_INT32),
        ("tokenizer.ggml.bos_token_id", T_UINT32, 1),
        ("tokenizer.ggml.eos_token_id", T_UINT32, 2),
        ("tokenizer.ggml.unknown_token_id", T_UINT32, 0),
        ("tokenizer.ggml.add_bos_token", T_BOOL, True),
        ("tokenizer.ggml.add_eos_token", T_BOOL, False),
    ]

    # Offsets are known from shapes alone, so the tensor infos can be written
    # before any weight is drawn and each tensor streamed out one at a time.
    infos, offset, n_params = [], 0, 0
    for tname, ne, kind in specs:
        # Matrices take the weight type; 1-D tensors (norms, biases, ssm_d) and ssm_a stay f32,
        # as llama.cpp's converters write them.
        f32 = kind != "" or len(ne) == 1 or "conv" in tname
        ggml_type, dtype = (GGML_F32, np.dtype("<f4")) if f32 else (w_ggml, w_dtype)
        n = int(np.prod(ne))
        infos.append((tname, ne, kind, ggml_type, dtype, offset))
        offset += -(-n * dtype.itemsize // ALIGNMENT) * ALIGNMENT
        n_params += n

    rng = np.random.default_rng(seed)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            w = _Writer(f)
            f.write(GGUF_MAGIC)
            w.pack("IQQ", GGUF_VERSION, len(infos), len(kvs))
            for kv in kvs:
                w.kv(*kv)
            for tname, ne, _, ggml_type, _, toff in infos:
                w.string(tname)
                w.pack("I", len(ne))
                w.pack("%dQ" % len(ne), *ne)
                w.pack("IQ", ggml_type, toff)
            w.pad()
            data_start = f.tell()
            for tname, ne, kind, _, dtype, toff in infos:
                assert f.tell() - data_start == toff
                f.write(_random_tensor(rng, tname, ne, kind).astype(dtype).tobytes())
                w.pad()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise

    return dict(path=path, preset=preset, seed=seed, wtype=wname, name=model_name,
                n_params=n_params, n_vocab=len(tokens), n_tensors=len(infos),
                file_size=os.path.getsize(path), **{k: h[k] for k in
                ("arch", "layers", "embd", "heads", "kv_heads", "ff", "ctx", "swa")})


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a random-weight GGUF v3 model.")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output .gguf path")
    ap.add_argument("--type", dest="wtype", choices=sorted(WEIGHT_TYPES),
                    help="matrix weight type (default: f32 for tiny, f16 for medium)")
    ap.add_argument("--name", help="general.name (default: derived from preset and seed)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--embd", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", dest="kv_heads", type=int)
    ap.add_argument("--ff", type=int)
    ap.add_argument("--ctx", type=int)
    ap.add_argument("--swa", type=int, help="gemma2: the sliding window")
    a = ap.parse_args(argv)
    try:
        info = write_model(a.out, preset=a.preset, seed=a.seed, wtype=a.wtype, name=a.name,
                           layers=a.layers, embd=a.embd, heads=a.heads,
                           kv_heads=a.kv_heads, ff=a.ff, ctx=a.ctx, swa=a.swa)
    except ValueError as e:
        ap.error(str(e))
    print("wrote %(path)s: arch=%(arch)s preset=%(preset)s seed=%(seed)d type=%(wtype)s "
          "layers=%(layers)d "
          "embd=%(embd)d heads=%(heads)d kv_heads=%(kv_heads)d ff=%(ff)d ctx=%(ctx)d "
          "vocab=%(n_vocab)d tensors=%(n_tensors)d params=%(n_params)d bytes=%(file_size)d" % info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
