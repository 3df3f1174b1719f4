#!/usr/bin/env python3
"""Cached KV and recurrent state from another process give the same answer: a tiny model, kvtier.

A decoder in pure PyTorch (CPU, fp32, random weights from a fixed seed; RoPE, grouped-query
attention, SwiGLU, 4 layers). `--model hybrid` (the default) makes its second layer a recurrent
one — a diagonal linear recurrence s_t = a * s_{t-1} + B x_t, y_t = C s_t with a fixed-size state
per sequence, as in state-space models — and keeps three attention layers; `--model attention`
has four attention layers. Its KV cache lives per block in kvtier, and the recurrent state in
kvtier's state checkpoints:

  process A  prefills a 500-token prompt and writes its KV, block by block, straight into the
             daemon's shared pool (WriteHandle blocks as NumPy views); hybrid: also the recurrent
             state at every block boundary, as checkpoints of its sequence (detached, so that
             they outlive A); then exits;
  process B  a separate process, looks up a 520-token prompt whose first 460 tokens are A's:
             kvtier answers with the longest cached prefix made of whole blocks (448 tokens),
             bound to B's own sequence; hybrid: B also reads the recurrent state at 448 from A's
             checkpoint. B copies those blocks (zero-copy views) into its own cache, computes only
             the other 72 tokens, and checks its logits against a full recompute of all 520.

    # against a running kvtierd (e.g. KEEP_RUNNING=1 bash scripts/run-demo.sh):
    PYTHONPATH=build/bindings/python /usr/bin/python3 examples/tiny_transformer.py \
        --socket kvtier-data/kvtierd.sock
    # or with a throwaway daemon of its own:
    PYTHONPATH=build/bindings/python /usr/bin/python3 examples/tiny_transformer.py \
        --kvtierd build/daemon/kvtierd

B prints the prefill time saved and a last line `RESULT {json}`; the exit status is 0 only when
B's logits equal the full recompute within fp32 tolerance. (They came out bit-identical where
it was tested: B does the same operations on the same values in the same order — the recurrence
runs token by token from the stored state's very bytes, and a row of a matmul is the same sum
whatever the other rows — but a BLAS may split a matmul of 72 rows differently from one of 520,
so the check allows fp32 rounding.)
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

import numpy as np
import torch

import kvtier


@dataclass(frozen=True)
class Config:
    model_id: str
    # Each layer's mixer: "attention" (its K and V cached per block in kvtier) or "recurrent" (a
    # fixed-size state, checkpointed in kvtier at block boundaries); an MLP follows each.
    mixers: tuple[str, ...]
    vocab: int = 2048
    d_model: int = 256
    n_heads: int = 8
    n_kv_heads: int = 2  # grouped-query attention: 4 query heads share each KV head
    head_dim: int = 32
    d_ff: int = 768
    d_state: int = 512  # recurrent state per layer: 512 fp32 values, 2 KiB
    rope_base: float = 10000.0
    block_tokens: int = 16  # kvtier block size
    seed: int = 1234

    @property
    def n_attention(self):
        return self.mixers.count("attention")

    @property
    def n_recurrent(self):
        return self.mixers.count("recurrent")


MODELS = {
    "hybrid": Config(
        "kvtier-example/tiny-hybrid", ("attention", "recurrent", "attention", "attention")
    ),
    "attention": Config("kvtier-example/tiny-gqa", ("attention",) * 4),
}
PROMPT_A_TOKENS = 500  # A's prompt: 31 full blocks and a partial one
SHARED_TOKENS = 460  # B's prompt begins with A's first 460 tokens...
PROMPT_B_TOKENS = 520  # ...and continues with 60 of its own
TOLERANCE = 1e-4  # fp32: atol and rtol of the logits comparison
REPEATS = 5  # timings: median of this many runs
# A's sequence, where B finds the recurrent state: a lookup matches blocks by their tokens and
# binds only blocks (the index holds no state), so a checkpoint is read from the sequence that
# stored it, by name. A fixed name: a second prefill replaces the first.
A_SEQ = "tiny-transformer-A"


def layout_for(cfg):
    """The kvtier layout of this model's KV: per attention layer K (after RoPE) and V of every
    KV head. The recurrent state is not part of it: checkpoints are blobs of any size."""
    return kvtier.Layout(
        cfg.model_id,
        num_layers=cfg.n_attention,
        num_kv_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        dtype="float32",
        block_tokens=cfg.block_tokens,
        rope=kvtier.Rope("neox", cfg.head_dim, cfg.rope_base),
    )


def prompts(cfg, shared=SHARED_TOKENS):
    """A's prompt, and B's: A's first `shared` tokens, then tokens of its own."""
    g = torch.Generator().manual_seed(7)
    a = torch.randint(0, cfg.vocab, (PROMPT_A_TOKENS,), generator=g)
    tail = torch.randint(0, cfg.vocab, (PROMPT_B_TOKENS - shared,), generator=g)
    b = torch.cat([a[:shared], tail])
    assert int(a[shared]) != int(b[shared])
    return a, b


class Cache:
    """The model's own cache. Attention layers: K and V of shape [attention layers, kv_heads,
    capacity, head_dim]. Recurrent layers: their state after the last token, [recurrent layers,
    d_state], and its value at each block boundary the forward passed, by position (the
    checkpoints A stores)."""

    def __init__(self, cfg, capacity):
        shape = (cfg.n_attention, cfg.n_kv_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape)
        self.v = torch.zeros(shape)
        self.state = torch.zeros(cfg.n_recurrent, cfg.d_state)
        self.checkpoints = {}
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
    """A Llama-shaped decoder with random weights (fixed seed), some of whose layers may be
    recurrent instead of attention."""

    def __init__(self, cfg):
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)

        def w(*shape):
            return torch.randn(*shape, generator=g) / math.sqrt(shape[0])

        qd, kvd = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.embed = torch.randn(cfg.vocab, cfg.d_model, generator=g)
        self.layers = []
        for i, mixer in enumerate(cfg.mixers):
            # slot: the layer's index in the cache's K and V, or in its recurrent state.
            p = dict(mixer=mixer, slot=cfg.mixers[:i].count(mixer), norm=torch.ones(cfg.d_model))
            if mixer == "attention":
                p.update(wq=w(cfg.d_model, qd), wk=w(cfg.d_model, kvd), wv=w(cfg.d_model, kvd),
                         wo=w(qd, cfg.d_model))
            else:
                # Per-channel decay a from 0.999 to 0.5 (memories of ~1000 to ~1 tokens); each
                # channel's input scaled by sqrt(1 - a^2) keeps the state near unit variance, as
                # in LRU.
                decay = 1 - torch.logspace(-3, math.log10(0.5), cfg.d_state)
                p.update(decay=decay, w_in=w(cfg.d_model, cfg.d_state) * (1 - decay**2).sqrt(),
                         w_out=w(cfg.d_state, cfg.d_model))
            p.update(mlp_norm=torch.ones(cfg.d_model), w_gate=w(cfg.d_model, cfg.d_ff),
                     w_up=w(cfg.d_model, cfg.d_ff), w_down=w(cfg.d_ff, cfg.d_model))
            self.layers.append(p)
        self.final_norm = torch.ones(cfg.d_model)
        self.lm_head = w(cfg.d_model, cfg.vocab)

    @torch.inference_mode()
    def forward(self, tokens, cache):
        """Logits [T, vocab] of `tokens` at positions [cache.length, cache.length + T); appends
        their K and V to `cache` and advances its recurrent state."""
        start = cache.length
        x = self.embed[tokens]
        for p in self.layers:
            h = rms_norm(x, p["norm"])
            if p["mixer"] == "attention":
                x = x + self._attention(h, p, cache, start)
            else:
                x = x + self._recurrence(h, p, cache, start)
            h = rms_norm(x, p["mlp_norm"])
            x = x + (torch.nn.functional.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]
        cache.length = start + len(tokens)
        return rms_norm(x, self.final_norm) @ self.lm_head

    def _attention(self, h, p, cache, start):
        cfg, layer, t = self.cfg, p["slot"], len(h)
        end = start + t
        positions = torch.arange(start, end)
        group = cfg.n_heads // cfg.n_kv_heads
        # Query i (position start + i) sees keys 0 .. start + i.
        mask = torch.full((t, end), float("-inf")).triu(start + 1)
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
        return attn.transpose(0, 1).reshape(t, -1) @ p["wo"]

    def _recurrence(self, h, p, cache, start):
        # Token by token rather than as a parallel scan: the state after a position is then the
        # same bits whether the run began at 0 or at a checkpoint.
        layer, block = p["slot"], self.cfg.block_tokens
        inputs = h @ p["w_in"]  # B x_t of every token, [T, d_state]
        states = torch.empty_like(inputs)
        s = cache.state[layer]
        for i in range(len(inputs)):
            s = p["decay"] * s + inputs[i]
            states[i] = s
            pos = start + i + 1  # s is the state at pos: after the tokens before it
            if pos % block == 0:
                cache.checkpoints.setdefault(pos, torch.empty_like(cache.state))[layer] = s
        cache.state[layer] = s
        return states @ p["w_out"]


def store_blocks(space, seq, tokens, cache, detached):
    """Writes the cache's KV of `tokens` into kvtier, one pool block at a time, and commits."""
    k, v = cache.k.numpy(), cache.v.numpy()  # [layers, kv_heads, T, head_dim], no copy
    with space.begin_put(seq, 0, tokens.tolist(), detached=detached) as w:
        for block in w.blocks():
            first = block.first_position
            n = min(block.shape[2], len(tokens) - first)
            a = block.numpy()  # [layers, K|V, block_tokens, kv_heads, head_dim] in the pool
            a[:, 0, :n] = k[:, :, first : first + n].transpose(0, 2, 1, 3)
            a[:, 1, :n] = v[:, :, first : first + n].transpose(0, 2, 1, 3)
            del a  # a view must not outlive its handle
        return w.commit()


def store_checkpoints(space, seq, cache):
    """Stores the recurrent state at each block boundary as a checkpoint of seq (after its KV: a
    checkpoint lies within the sequence, and a put drops those past its start)."""
    for pos, state in sorted(cache.checkpoints.items()):
        space.put_checkpoint(seq, pos, state.numpy())
    return sorted(cache.checkpoints)


def resume_point(space, seq, hit):
    """Where B can continue from seq's recurrent state: the largest position <= the hit's length
    at which seq has a checkpoint and holds the very blocks of the hit. A checkpoint is the state
    after its own sequence's tokens, and a sealed block's key hashes every token up to its end, so
    the same blocks mean the same tokens. Returns that position (0: none, start from scratch) and
    all of seq's checkpoint positions."""
    length = space.length(seq)
    if length is None:
        return 0, []
    bt = space.layout.block_tokens
    same = 0
    with space.get(seq, 0, min(hit.matched_tokens, length - length % bt)) as own:
        for a, b in zip(own.refs, hit.refs):
            if (a.extent, a.offset, a.generation) != (b.extent, b.offset, b.generation):
                break
            same += bt
    positions = space.checkpoints(seq)
    return max((p for p in positions if p <= same), default=0), positions


def load_blocks(hit, cache, length):
    """Copies the hit's KV of positions [0, length) into the cache (each block read in place from
    the shared pool)."""
    k, v = cache.k.numpy(), cache.v.numpy()
    for block in hit.blocks():
        first = block.first_position
        n = min(block.shape[2], length - first)
        if n <= 0:
            break
        a = block.numpy()
        k[:, :, first : first + n] = a[:, 0, :n].transpose(0, 2, 1, 3)
        v[:, :, first : first + n] = a[:, 1, :n].transpose(0, 2, 1, 3)
        del a
    cache.length = length


def restore(space, hit, state_seq, cache):
    """Loads what B reuses into `cache`: the recurrent state at the resume point, read from
    state_seq's checkpoint (a model without recurrent layers resumes at the hit's end), and the
    hit's KV up to there. Returns the resume point and state_seq's checkpoint positions."""
    if cache.state.shape[0] == 0:  # no recurrent layers
        resume, positions = hit.matched_tokens, []
    else:
        resume, positions = resume_point(space, state_seq, hit)
        if resume > 0:
            with space.get_checkpoint(state_seq, resume) as blob:
                cache.state.numpy()[:] = blob.numpy().view(np.float32).reshape(cache.state.shape)
    load_blocks(hit, cache, resume)
    return resume, positions


def max_diff(a, b):
    return float((a - b).abs().max()) if a.numel() else 0.0


def ms(seconds):
    return f"{seconds * 1e3:.1f} ms"


def prefill(space, cfg, tokens):
    """Process A's work: prefill `tokens`, put their KV and (hybrid) their recurrent state."""
    model = TinyDecoder(cfg)
    cache = Cache(cfg, len(tokens))
    t0 = time.perf_counter()
    model.forward(tokens, cache)
    t1 = time.perf_counter()
    # Detached when the model has state: B reads A's checkpoints after A's session ended.
    info = store_blocks(space, A_SEQ, tokens, cache, detached=cfg.n_recurrent > 0)
    t2 = time.perf_counter()
    checkpoints = store_checkpoints(space, A_SEQ, cache)
    t3 = time.perf_counter()
    return dict(tokens=len(tokens), sealed=info.sealed_blocks, seq=A_SEQ, checkpoints=checkpoints,
                prefill_s=t1 - t0, put_s=t2 - t1, checkpoint_s=t3 - t2)


def run_prefill(args):
    """Process A: prefill prompt A and put its KV (and recurrent state)."""
    pid, cfg = os.getpid(), MODELS[args.model]
    prompt_a, _ = prompts(cfg)
    with kvtier.Client(args.socket, client_name="example-A") as client:
        space = client.open(layout_for(cfg))
        put = prefill(space, cfg, prompt_a)
    kv_bytes = len(prompt_a) * space.layout.token_kv_bytes
    state = ""
    if put["checkpoints"]:
        state = (
            f"; and the recurrent state at {len(put['checkpoints'])} block boundaries "
            f"({cfg.n_recurrent * cfg.d_state * 4 / 1024:g} KiB each) as checkpoints of detached "
            f"sequence '{A_SEQ}' in {ms(put['checkpoint_s'])}"
        )
    print(
        f"[A pid {pid}] prefilled {len(prompt_a)} tokens of the {args.model} model in "
        f"{ms(put['prefill_s'])}; wrote their KV block by block into the shared pool: "
        f"{put['sealed']} full blocks sealed and indexed, "
        f"{len(prompt_a) % cfg.block_tokens} tokens in a partial block, "
        f"{kv_bytes / 2**20:.2f} MiB in {ms(put['put_s'])}{state}",
        flush=True,
    )
    keys = ("tokens", "sealed", "seq", "checkpoints")
    print("PUT " + json.dumps({"pid": pid, "model": args.model} | {k: put[k] for k in keys}))


def reuse(space, cfg, prompt, repeats):
    """Process B's work: reuse the cached prefix of `prompt` and A's recurrent state; compare with
    a full recompute. Returns the figures (RESULT's)."""
    model = TinyDecoder(cfg)
    model.forward(prompt[:32], Cache(cfg, 32))  # warm-up: exclude one-time costs

    full_times, full = [], None
    for _ in range(repeats):
        cache_full = Cache(cfg, len(prompt))
        t0 = time.perf_counter()
        logits = model.forward(prompt, cache_full)
        full_times.append(time.perf_counter() - t0)
        full = full if full is not None else (logits, cache_full)
    full_logits, cache_full = full

    # B's own request sequence: the lookup makes the hit its prefix, where a serving engine would
    # continue the request. A bind carries blocks only (checkpoints stay with the sequence that
    # stored them), so the state comes from A's sequence.
    b_seq = f"tiny-transformer-B-{os.getpid()}"
    cached_times, load_times, rest = [], [], None
    for _ in range(repeats):
        cache = Cache(cfg, len(prompt))
        t0 = time.perf_counter()
        with space.lookup(prompt.tolist(), bind_seq=b_seq) as hit:
            resume, checkpoints = restore(space, hit, A_SEQ, cache)
            hit_tokens, hit_blocks = hit.matched_tokens, hit.block_count
        t1 = time.perf_counter()
        logits = model.forward(prompt[resume:], cache)
        t2 = time.perf_counter()
        load_times.append(t1 - t0)
        cached_times.append(t2 - t0)
        rest = rest if rest is not None else (logits, cache)
    rest_logits, cache = rest

    expected = full_logits[resume:]
    # The control: the same KV with a zero recurrent state instead of the checkpoint's. Its
    # logits differ, so the checkpoint is what makes B's equal.
    stateless_diff = None
    if cfg.n_recurrent and resume > 0:
        stateless = Cache(cfg, len(prompt))
        stateless.k[:], stateless.v[:], stateless.length = cache_full.k, cache_full.v, resume
        stateless_diff = max_diff(model.forward(prompt[resume:], stateless), expected)
    t_full, t_cached = statistics.median(full_times), statistics.median(cached_times)
    t_load = statistics.median(load_times)
    return {
        "model": cfg.model_id,
        "prompt_tokens": len(prompt),
        "hit_tokens": hit_tokens,
        "hit_blocks": hit_blocks,
        "resume_tokens": resume,
        "computed_tokens": len(prompt) - resume,
        "state_checkpoints": checkpoints,
        "max_abs_diff": max_diff(rest_logits, expected),
        "kv_max_abs_diff": max(max_diff(cache.k[:, :, :resume], cache_full.k[:, :, :resume]),
                               max_diff(cache.v[:, :, :resume], cache_full.v[:, :, :resume])),
        # B's state after the whole prompt, continued from A's checkpoint, against the recompute's.
        "state_max_abs_diff": max_diff(cache.state, cache_full.state),
        "stateless_max_abs_diff": stateless_diff,
        "tolerance": TOLERANCE,
        "equal": bool(torch.allclose(rest_logits, expected, atol=TOLERANCE, rtol=TOLERANCE)),
        "same_next_tokens": bool(torch.equal(rest_logits.argmax(-1), expected.argmax(-1))),
        "full_prefill_ms": t_full * 1e3,
        "cached_prefill_ms": t_cached * 1e3,
        "lookup_load_ms": t_load * 1e3,
        "saved_ms": (t_full - t_cached) * 1e3,
    }


def run_reuse(args):
    """Process B: reuse A's cached prefix; compare with a full recompute."""
    pid, cfg = os.getpid(), MODELS[args.model]
    _, prompt_b = prompts(cfg)
    with kvtier.Client(args.socket, client_name="example-B") as client:
        r = reuse(client.open(layout_for(cfg)), cfg, prompt_b, args.repeats)
    state = ""
    if cfg.n_recurrent:
        state = (
            f", recurrent state from A's checkpoint at {r['resume_tokens']}"
            if r["resume_tokens"]
            else ", no recurrent state to resume from"
        )
    print(
        f"[B pid {pid}] lookup of a {r['prompt_tokens']}-token prompt sharing A's first "
        f"{SHARED_TOKENS} tokens: hit {r['hit_tokens']} tokens ({r['hit_blocks']} blocks)"
        f"{state}, {r['computed_tokens']} tokens to compute",
        flush=True,
    )
    state = f", state after it: {r['state_max_abs_diff']:.2e}" if cfg.n_recurrent else ""
    print(
        f"[B pid {pid}] logits of the {r['computed_tokens']} computed positions against a full "
        f"recompute of {r['prompt_tokens']}: max |diff| {r['max_abs_diff']:.2e} (cached KV vs "
        f"recomputed: {r['kv_max_abs_diff']:.2e}{state}; tolerance {TOLERANCE:g}): "
        f"{'EQUAL' if r['equal'] else 'DIFFERENT'}, same next tokens: {r['same_next_tokens']}",
        flush=True,
    )
    if r["stateless_max_abs_diff"] is not None:
        print(
            f"[B pid {pid}] the same KV with a zero recurrent state instead of the checkpoint's: "
            f"max |diff| {r['stateless_max_abs_diff']:.2e}",
            flush=True,
        )
    t_full, t_cached, t_load = r["full_prefill_ms"], r["cached_prefill_ms"], r["lookup_load_ms"]
    print(
        f"[B pid {pid}] prefill {t_full:.1f} ms from scratch, {t_cached:.1f} ms with cached "
        f"{'KV and state' if cfg.n_recurrent else 'KV'} (lookup + load {t_load:.1f} ms, compute "
        f"{t_cached - t_load:.1f} ms): {r['saved_ms']:.1f} ms saved "
        f"({(1 - t_cached / t_full) * 100:.0f}%), median of {args.repeats}",
        flush=True,
    )
    print("RESULT " + json.dumps({"pid": pid, "shared_tokens": SHARED_TOKENS} | r), flush=True)
    return 0 if r["equal"] else 1


def run_both(args):
    """Runs A, then B, each as a process of its own."""
    if args.kvtierd:
        import kvtier.testing

        with kvtier.testing.Daemon(args.kvtierd) as daemon:
            return run_both(argparse.Namespace(**vars(args) | {"socket": daemon.socket,
                                                               "kvtierd": None}))
    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--socket", args.socket, "--model", args.model, "--repeats", str(args.repeats)]
    subprocess.run(me + ["prefill"] + common, check=True)
    return subprocess.run(me + ["reuse"] + common).returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", choices=["both", "prefill", "reuse"], default="both",
                        help="both (default): run A then B as separate processes")
    parser.add_argument("--model", choices=sorted(MODELS), default="hybrid",
                        help="hybrid (default): attention and a recurrent layer; attention: "
                             "attention only")
    parser.add_argument("--socket", default="kvtier-data/kvtierd.sock", help="kvtierd's socket")
    parser.add_argument("--kvtierd", help="start a throwaway kvtierd from this path instead")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help=f"B's timings: the median of this many runs (default {REPEATS})")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.role == "prefill":
        return run_prefill(args)
    if args.role == "reuse":
        return run_reuse(args)
    return run_both(args)


if __name__ == "__main__":
    sys.exit(main() or 0)
