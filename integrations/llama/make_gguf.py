#!/usr/bin/python3
"""Write a llama-architecture GGUF (v3) model with random weights.

Tests and benchmarks of the llama.cpp integration need real model files that
llama.cpp loads and runs, yet nothing may be downloaded here and the `gguf`
pip package is not available.  This module is a small GGUF v3 writer of our
own: it needs only the Python standard library and numpy, so it runs with
Debian's /usr/bin/python3 (apt package python3-numpy).

The model is a plain llama (RMS norm, RoPE, GQA attention, SwiGLU FFN) with a
tiny SentencePiece-style ("llama") vocabulary: <unk> <s> </s>, the 256 byte
tokens <0x00>..<0xFF> (so any text tokenizes via byte fallback), then a few
dozen "▁"-prefixed word pieces.  Weights are drawn from
numpy.random.default_rng(seed) in a fixed order, so the same arguments give a
byte-identical file and a different seed gives different weights.

Format facts (checked against llama.cpp's ggml/src/gguf.cpp, src/llama-arch.cpp,
src/models/llama.cpp and src/llama-vocab.cpp):
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

Usage:
  /usr/bin/python3 integrations/llama/make_gguf.py --preset tiny --seed 1 --out tiny.gguf
  /usr/bin/python3 integrations/llama/make_gguf.py --preset medium --seed 1 --out medium.gguf

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

PRESETS = {
    # smallest useful GQA model: loads in milliseconds, for unit tests
    # (head dim 32: the smallest a quantized q8_0 K cache accepts, whose blocks are 32 wide)
    "tiny": dict(layers=2, embd=64, heads=2, kv_heads=1, ff=128, ctx=4096, wtype="f32"),
    # ~24M parameters, 4:1 GQA: big enough for KV-cache traffic to matter
    "medium": dict(layers=8, embd=512, heads=8, kv_heads=2, ff=1536, ctx=8192, wtype="f16"),
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


def _tensor_specs(h, n_vocab):
    """(name, ne, is_norm) for every tensor, in file order.

    ne follows llama.cpp's create_tensor() shapes in src/models/llama.cpp,
    innermost dimension first.
    """
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
    return specs


def _random_tensor(rng, name, ne, is_norm):
    """Draw one tensor as float32 with numpy shape reversed(ne)."""
    shape = tuple(reversed(ne))
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
    for k in ("layers", "embd", "heads", "kv_heads", "ff", "ctx"):
        if int(h[k]) <= 0:
            raise ValueError("%s must be positive" % k)
    if h["embd"] % h["heads"] or h["heads"] % h["kv_heads"]:
        raise ValueError("embd must be a multiple of heads and heads of kv_heads")
    if (h["embd"] // h["heads"]) % 2:
        raise ValueError("head dimension must be even for RoPE")
    return h


def write_model(path, preset="tiny", seed=0, wtype=None, name=None, **overrides):
    """Write a random-weight llama GGUF to `path`; return a summary dict.

    overrides: layers, embd, heads, kv_heads, ff, ctx (None keeps the preset).
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

    kvs = [
        ("general.architecture", T_STRING, "llama"),
        ("general.name", T_STRING, model_name),
        ("general.alignment", T_UINT32, ALIGNMENT),
        ("general.file_type", T_UINT32, FILE_TYPE[wname]),
        ("llama.context_length", T_UINT32, h["ctx"]),
        ("llama.embedding_length", T_UINT32, h["embd"]),
        ("llama.block_count", T_UINT32, h["layers"]),
        ("llama.feed_forward_length", T_UINT32, h["ff"]),
        ("llama.attention.head_count", T_UINT32, h["heads"]),
        ("llama.attention.head_count_kv", T_UINT32, h["kv_heads"]),
        # llama.cpp rejects a llama model whose n_rot differs from head_dim
        ("llama.rope.dimension_count", T_UINT32, h["embd"] // h["heads"]),
        ("llama.rope.freq_base", T_FLOAT32, ROPE_FREQ_BASE),
        ("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, RMS_EPS),
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
    for tname, ne, is_norm in specs:
        ggml_type, dtype = (GGML_F32, np.dtype("<f4")) if is_norm else (w_ggml, w_dtype)
        n = int(np.prod(ne))
        infos.append((tname, ne, is_norm, ggml_type, dtype, offset))
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
            for tname, ne, is_norm, _, dtype, toff in infos:
                assert f.tell() - data_start == toff
                f.write(_random_tensor(rng, tname, ne, is_norm).astype(dtype).tobytes())
                w.pad()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise

    return dict(path=path, preset=preset, seed=seed, wtype=wname, name=model_name,
                n_params=n_params, n_vocab=len(tokens), n_tensors=len(infos),
                file_size=os.path.getsize(path), **{k: h[k] for k in
                ("layers", "embd", "heads", "kv_heads", "ff", "ctx")})


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a random-weight llama GGUF v3 model.")
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
    a = ap.parse_args(argv)
    try:
        info = write_model(a.out, preset=a.preset, seed=a.seed, wtype=a.wtype, name=a.name,
                           layers=a.layers, embd=a.embd, heads=a.heads,
                           kv_heads=a.kv_heads, ff=a.ff, ctx=a.ctx)
    except ValueError as e:
        ap.error(str(e))
    print("wrote %(path)s: preset=%(preset)s seed=%(seed)d type=%(wtype)s layers=%(layers)d "
          "embd=%(embd)d heads=%(heads)d kv_heads=%(kv_heads)d ff=%(ff)d ctx=%(ctx)d "
          "vocab=%(n_vocab)d tensors=%(n_tensors)d params=%(n_params)d bytes=%(file_size)d" % info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
