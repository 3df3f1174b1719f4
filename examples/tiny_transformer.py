#!/usr/bin/env python3
"""Cached KV from another process gives the same answer: a tiny transformer over kvtier.

A decoder-only transformer in pure PyTorch (CPU, fp32, random weights from a fixed seed; RoPE,
grouped-query attention, SwiGLU, 4 layers) keeps its KV cache per block in kvtier:

  process A  prefills a 500-token prompt and writes its KV, block by block, straight into the
             daemon's shared pool (WriteHandle blocks as NumPy views), then exits;
  process B  a separate process, looks up a 520-token prompt whose first 460 tokens are A's:
             kvtier answers with the longest cached prefix made of whole blocks (448 tokens);
             B copies those blocks (zero-copy views) into its own cache, computes only the
             other 72 tokens, and checks its logits against a full recompute of all 520.

    # against a running kvtierd (e.g. KEEP_RUNNING=1 bash scripts/run-demo.sh):
    PYTHONPATH=build/bindings/python /usr/bin/python3 examples/tiny_transformer.py \
        --socket kvtier-data/kvtierd.sock
    # or with a throwaway daemon of its own:
    PYTHONPATH=build/bindings/python /usr/bin/python3 examples/tiny_transformer.py \
        --kvtierd build/daemon/kvtierd

B prints the prefill time saved and a last line `RESULT {json}`; the exit status is 0 only when
B's logits equal the full recompute within fp32 tolerance.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

import kvtier


@dataclass(frozen=True)
class Config:
    vocab: int = 2048
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2  # grouped-query attention: 4 query heads share each KV head
    head_dim: int = 32
    d_ff: int = 768
    rope_base: float = 10000.0
    block_tokens: int = 16  # kvtier block size
    seed: int = 1234


CONFIG = Config()
PROMPT_A_TOKENS = 500  # A's prompt: 31 full blocks and a partial one
SHARED_TOKENS = 460  # B's prompt begins with A's first 460 tokens...
PROMPT_B_TOKENS = 520  # ...and continues with 60 of its own
TOLERANCE = 1e-4  # fp32: atol and rtol of the logits comparison
REPEATS = 5  # timings: median of this many runs


def layout_for(cfg):
    """The kvtier layout of this model's KV: per layer K (after RoPE) and V of every KV head."""
    return kvtier.Layout(
        "kvtier-example/tiny-gqa",
        num_layers=cfg.n_layers,
        num_kv_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        dtype="float32",
        block_tokens=cfg.block_tokens,
        rope=kvtier.Rope("neox", cfg.head_dim, cfg.rope_base),
    )


def prompts(cfg):
    g = torch.Generator().manual_seed(7)
    a = torch.randint(0, cfg.vocab, (PROMPT_A_TOKENS,), generator=g)
    tail = torch.randint(0, cfg.vocab, (PROMPT_B_TOKENS - SHARED_TOKENS,), generator=g)
    b = torch.cat([a[:SHARED_TOKENS], tail])
    assert int(a[SHARED_TOKENS]) != int(b[SHARED_TOKENS])
    return a, b


class KvCache:
    """The model's own cache: K and V of shape [layers, kv_heads, capacity, head_dim]."""

    def __init__(self, cfg, capacity):
        shape = (cfg.n_layers, cfg.n_kv_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape)
        self.v = torch.zeros(shape)
        self.length = 0


def rope(x, positions, base):
    """NeoX-style rotary embedding of x [heads, T, D]: dims d and d + D/2 rotate together."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = base ** (-torch.arange(0, half, dtype=torch.float32) * 2 / d)
    angles = positions[:, None].to(torch.float32) * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def rms_norm(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class TinyDecoder:
    """A Llama-shaped decoder with random weights (fixed seed)."""

    def __init__(self, cfg):
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)

        def w(*shape):
            return torch.randn(*shape, generator=g) / math.sqrt(shape[0])

        qd, kvd = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.embed = torch.randn(cfg.vocab, cfg.d_model, generator=g)
        self.layers = [
            dict(
                attn_norm=torch.ones(cfg.d_model),
                wq=w(cfg.d_model, qd),
                wk=w(cfg.d_model, kvd),
                wv=w(cfg.d_model, kvd),
                wo=w(qd, cfg.d_model),
                mlp_norm=torch.ones(cfg.d_model),
                w_gate=w(cfg.d_model, cfg.d_ff),
                w_up=w(cfg.d_model, cfg.d_ff),
                w_down=w(cfg.d_ff, cfg.d_model),
            )
            for _ in range(cfg.n_layers)
        ]
        self.final_norm = torch.ones(cfg.d_model)
        self.lm_head = w(cfg.d_model, cfg.vocab)

    @torch.inference_mode()
    def forward(self, tokens, cache):
        """Logits [T, vocab] of `tokens` at positions [cache.length, cache.length + T); appends
        their K and V to `cache`."""
        cfg = self.cfg
        start, t = cache.length, len(tokens)
        end = start + t
        positions = torch.arange(start, end)
        group = cfg.n_heads // cfg.n_kv_heads
        # Query i (position start + i) sees keys 0 .. start + i.
        mask = torch.full((t, end), float("-inf")).triu(start + 1)
        x = self.embed[tokens]
        for layer, p in enumerate(self.layers):
            h = rms_norm(x, p["attn_norm"])
            q = (h @ p["wq"]).view(t, cfg.n_heads, cfg.head_dim).transpose(0, 1)
            k = (h @ p["wk"]).view(t, cfg.n_kv_heads, cfg.head_dim).transpose(0, 1)
            v = (h @ p["wv"]).view(t, cfg.n_kv_heads, cfg.head_dim).transpose(0, 1)
            q, k = rope(q, positions, cfg.rope_base), rope(k, positions, cfg.rope_base)
            cache.k[layer, :, start:end] = k
            cache.v[layer, :, start:end] = v
            keys = cache.k[layer, :, :end].repeat_interleave(group, dim=0)
            values = cache.v[layer, :, :end].repeat_interleave(group, dim=0)
            scores = q @ keys.transpose(1, 2) / math.sqrt(cfg.head_dim) + mask
            attn = torch.softmax(scores, dim=-1) @ values  # [heads, T, D]
            x = x + attn.transpose(0, 1).reshape(t, -1) @ p["wo"]
            h = rms_norm(x, p["mlp_norm"])
            x = x + (torch.nn.functional.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]
        cache.length = end
        return rms_norm(x, self.final_norm) @ self.lm_head


def store_blocks(space, seq, tokens, cache):
    """Writes the cache's KV of `tokens` into kvtier, one pool block at a time, and commits."""
    k, v = cache.k.numpy(), cache.v.numpy()  # [layers, kv_heads, T, head_dim], no copy
    with space.begin_put(seq, 0, tokens.tolist()) as w:
        for block in w.blocks():
            first = block.first_position
            n = min(block.shape[2], len(tokens) - first)
            a = block.numpy()  # [layers, K|V, block_tokens, kv_heads, head_dim] in the pool
            a[:, 0, :n] = k[:, :, first : first + n].transpose(0, 2, 1, 3)
            a[:, 1, :n] = v[:, :, first : first + n].transpose(0, 2, 1, 3)
            del a  # a view must not outlive its handle
        return w.commit()


def load_blocks(hit, cache):
    """Copies the hit's blocks into the cache (each read in place from the shared pool)."""
    k, v = cache.k.numpy(), cache.v.numpy()
    for block in hit.blocks():
        first = block.first_position
        n = min(block.shape[2], hit.matched_tokens - first)
        a = block.numpy()
        k[:, :, first : first + n] = a[:, 0, :n].transpose(0, 2, 1, 3)
        v[:, :, first : first + n] = a[:, 1, :n].transpose(0, 2, 1, 3)
        del a
    cache.length = hit.matched_tokens


def ms(seconds):
    return f"{seconds * 1e3:.1f} ms"


def run_prefill(args):
    """Process A: prefill prompt A and put its KV."""
    pid = os.getpid()
    model = TinyDecoder(CONFIG)
    prompt_a, _ = prompts(CONFIG)
    cache = KvCache(CONFIG, len(prompt_a))
    t0 = time.perf_counter()
    model.forward(prompt_a, cache)
    prefill = time.perf_counter() - t0
    with kvtier.Client(args.socket, client_name="example-A") as client:
        space = client.open(layout_for(CONFIG))
        t0 = time.perf_counter()
        info = store_blocks(space, f"prefill-A-{pid}", prompt_a, cache)
        put = time.perf_counter() - t0
    kv_bytes = len(prompt_a) * space.layout.token_kv_bytes
    print(
        f"[A pid {pid}] prefilled {len(prompt_a)} tokens in {ms(prefill)}; wrote their KV block "
        f"by block into the shared pool: {info.sealed_blocks} full blocks sealed and indexed, "
        f"{len(prompt_a) % CONFIG.block_tokens} tokens in a partial block, "
        f"{kv_bytes / 2**20:.2f} MiB in {ms(put)}",
        flush=True,
    )
    print("PUT " + json.dumps({"pid": pid, "tokens": len(prompt_a), "sealed": info.sealed_blocks}))


def run_reuse(args):
    """Process B: reuse A's cached prefix; compare with a full recompute."""
    pid = os.getpid()
    model = TinyDecoder(CONFIG)
    _, prompt_b = prompts(CONFIG)
    model.forward(prompt_b[:32], KvCache(CONFIG, 32))  # warm-up: exclude one-time costs

    full_times, full = [], None
    for _ in range(REPEATS):
        cache_full = KvCache(CONFIG, len(prompt_b))
        t0 = time.perf_counter()
        logits = model.forward(prompt_b, cache_full)
        full_times.append(time.perf_counter() - t0)
        full = full if full is not None else (logits, cache_full)
    full_logits, cache_full = full

    with kvtier.Client(args.socket, client_name="example-B") as client:
        space = client.open(layout_for(CONFIG))
        cached_times, load_times, rest = [], [], None
        for _ in range(REPEATS):
            cache = KvCache(CONFIG, len(prompt_b))
            t0 = time.perf_counter()
            with space.lookup(prompt_b.tolist()) as hit:
                load_blocks(hit, cache)
                hit_tokens, hit_blocks = hit.matched_tokens, hit.block_count
            t1 = time.perf_counter()
            logits = model.forward(prompt_b[hit_tokens:], cache)
            t2 = time.perf_counter()
            load_times.append(t1 - t0)
            cached_times.append(t2 - t0)
            rest = rest if rest is not None else (logits, cache)
    rest_logits, cache = rest

    computed = len(prompt_b) - hit_tokens
    logits_diff = float((rest_logits - full_logits[hit_tokens:]).abs().max())
    kv_diff = max(
        float((cache.k[:, :, :hit_tokens] - cache_full.k[:, :, :hit_tokens]).abs().max()),
        float((cache.v[:, :, :hit_tokens] - cache_full.v[:, :, :hit_tokens]).abs().max()),
    )
    equal = bool(
        torch.allclose(rest_logits, full_logits[hit_tokens:], atol=TOLERANCE, rtol=TOLERANCE)
    )
    same_next = bool(
        torch.equal(rest_logits.argmax(-1), full_logits[hit_tokens:].argmax(-1))
    )
    t_full, t_cached = statistics.median(full_times), statistics.median(cached_times)
    t_load = statistics.median(load_times)
    print(
        f"[B pid {pid}] lookup of a {len(prompt_b)}-token prompt sharing A's first "
        f"{SHARED_TOKENS} tokens: hit {hit_tokens} tokens ({hit_blocks} blocks), "
        f"{computed} tokens to compute",
        flush=True,
    )
    print(
        f"[B pid {pid}] logits of the {computed} computed positions against a full recompute of "
        f"{len(prompt_b)}: max |diff| {logits_diff:.2e} (cached KV vs recomputed: "
        f"{kv_diff:.2e}; tolerance {TOLERANCE:g}): {'EQUAL' if equal else 'DIFFERENT'}, "
        f"same next tokens: {same_next}",
        flush=True,
    )
    print(
        f"[B pid {pid}] prefill {ms(t_full)} from scratch, {ms(t_cached)} with cached KV "
        f"(lookup + load {ms(t_load)}, compute {ms(t_cached - t_load)}): {ms(t_full - t_cached)} "
        f"saved ({(1 - t_cached / t_full) * 100:.0f}%), median of {REPEATS}",
        flush=True,
    )
    result = {
        "pid": pid,
        "prompt_tokens": len(prompt_b),
        "shared_tokens": SHARED_TOKENS,
        "hit_tokens": hit_tokens,
        "hit_blocks": hit_blocks,
        "computed_tokens": computed,
        "max_abs_diff": logits_diff,
        "kv_max_abs_diff": kv_diff,
        "tolerance": TOLERANCE,
        "equal": equal,
        "same_next_tokens": same_next,
        "full_prefill_ms": t_full * 1e3,
        "cached_prefill_ms": t_cached * 1e3,
        "lookup_load_ms": t_load * 1e3,
        "saved_ms": (t_full - t_cached) * 1e3,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0 if equal else 1


def run_both(args):
    """Runs A, then B, each as a process of its own."""
    if args.kvtierd:
        import kvtier.testing

        with kvtier.testing.Daemon(args.kvtierd) as daemon:
            return run_both(argparse.Namespace(socket=daemon.socket, kvtierd=None))
    me = [sys.executable, os.path.abspath(__file__)]
    subprocess.run(me + ["prefill", "--socket", args.socket], check=True)
    return subprocess.run(me + ["reuse", "--socket", args.socket]).returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", choices=["both", "prefill", "reuse"], default="both",
                        help="both (default): run A then B as separate processes")
    parser.add_argument("--socket", default="kvtier-data/kvtierd.sock", help="kvtierd's socket")
    parser.add_argument("--kvtierd", help="start a throwaway kvtierd from this path instead")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.role == "prefill":
        return run_prefill(args)
    if args.role == "reuse":
        return run_reuse(args)
    return run_both(args)


if __name__ == "__main__":
    sys.exit(main() or 0)
