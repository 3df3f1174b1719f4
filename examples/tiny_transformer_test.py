"""Runs examples/tiny_transformer.py against a real kvtierd and checks what it proves.

Process A and process B are separate processes (neither is this one); B's logits over the
tokens it computed must equal a full recompute within fp32 tolerance, after a hit of exactly
the block-aligned shared prefix — and, for the hybrid model, after restoring the recurrent state
from A's checkpoint at the end of that prefix. One timing run each (--repeats 1): the tests check
results, not times.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import kvtier
import kvtier.testing

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_transformer.py")
BOUNDARIES = list(range(16, 497, 16))  # the ends of the 31 full blocks of A's 500 tokens


@pytest.fixture
def daemon():
    if not os.environ.get("KVTIER_DAEMON"):
        pytest.skip("KVTIER_DAEMON is not set (run through ctest)")
    with kvtier.testing.Daemon() as d:
        yield d
        d.stop()
        assert d.exit_status == 0 and d.leftover_segments == []


def load_example():
    spec = importlib.util.spec_from_file_location("tiny_transformer", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(daemon, *args):
    run = subprocess.run(
        [sys.executable, EXAMPLE, *args, "--socket", daemon.socket, "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(run.stdout)
    print(run.stderr, file=sys.stderr)
    assert run.returncode == 0, run.stderr
    return run.stdout


def tagged(output, tag):
    lines = [line for line in output.splitlines() if line.startswith(tag + " ")]
    assert len(lines) == 1, output
    return json.loads(lines[0][len(tag) + 1 :])


def assert_equal_to_recompute(result):
    # B's logits equal a full recompute within fp32 tolerance (and so do the KV it loaded and
    # its recurrent state at the end).
    assert result["equal"] and result["max_abs_diff"] <= result["tolerance"] == 1e-4
    assert result["kv_max_abs_diff"] <= 1e-4 and result["state_max_abs_diff"] <= 1e-4
    assert result["same_next_tokens"]


def test_cached_kv_from_another_process_gives_the_same_logits(daemon):
    output = run_example(daemon, "both", "--model", "attention")
    put, result = tagged(output, "PUT"), tagged(output, "RESULT")
    # Two processes of their own.
    assert len({put["pid"], result["pid"], os.getpid()}) == 3
    # A sealed its 31 full blocks; B hit the 28 whole blocks of the 460 shared tokens.
    assert (put["tokens"], put["sealed"], put["checkpoints"]) == (500, 31, [])
    assert (result["hit_tokens"], result["hit_blocks"]) == (448, 28)
    assert result["resume_tokens"] == 448 and result["computed_tokens"] == 520 - 448
    assert_equal_to_recompute(result)
    # A's blocks outlived A's session: all 31 full blocks of its prompt still hit.
    example = load_example()
    cfg = example.MODELS["attention"]
    prompt_a, _ = example.prompts(cfg)
    with kvtier.Client(daemon.socket) as client:
        space = client.open(example.layout_for(cfg))
        with space.lookup(prompt_a.tolist()) as hit:
            assert hit.matched_tokens == 496


def test_hybrid_model_resumes_from_the_recurrent_state_checkpoint(daemon):
    # The roles one by one (the test above runs them through `both`).
    put = tagged(run_example(daemon, "prefill", "--model", "hybrid"), "PUT")
    result = tagged(run_example(daemon, "reuse", "--model", "hybrid"), "RESULT")
    assert len({put["pid"], result["pid"], os.getpid()}) == 3
    # A checkpointed the state at the end of each of its 31 full blocks, and kvtier lists those.
    assert (put["tokens"], put["sealed"], put["checkpoints"]) == (500, 31, BOUNDARIES)
    assert result["state_checkpoints"] == BOUNDARIES
    example = load_example()
    cfg = example.MODELS["hybrid"]
    with kvtier.Client(daemon.socket) as client:
        space = client.open(example.layout_for(cfg))
        assert space.checkpoints(put["seq"]) == BOUNDARIES
        # B hit the 28 whole blocks of the 460 shared tokens and went on from the state at their
        # end: it computed only its other 72 tokens.
        assert (result["hit_tokens"], result["hit_blocks"]) == (448, 28)
        assert result["resume_tokens"] == 448
        assert result["computed_tokens"] == 520 - 448 < result["prompt_tokens"]
        assert_equal_to_recompute(result)
        # The control: a zero state instead of the checkpoint's changes the logits, so the
        # comparison above depends on the restored state.
        assert result["stateless_max_abs_diff"] > 1e-2
        # A prompt that leaves A's inside the first block: no hit, no state to resume from; B
        # computes all of it, still equal to the recompute (this process is B here).
        _, diverging = example.prompts(cfg, shared=5)
        miss = example.reuse(space, cfg, diverging, repeats=1)
        assert (miss["hit_tokens"], miss["resume_tokens"], miss["computed_tokens"]) == (0, 0, 520)
        assert miss["stateless_max_abs_diff"] is None
        assert_equal_to_recompute(miss)
        # A hit longer than what B shares with A: another sequence puts the KV of B's whole
        # prompt (no state), so B's prompt hits 512 tokens, of which A holds the first 448 only;
        # A's checkpoints past 448 are the state after other tokens. B resumes at 448.
        _, prompt_b = example.prompts(cfg)
        cache = example.Cache(cfg, len(prompt_b))
        example.TinyDecoder(cfg).forward(prompt_b, cache)
        example.store_blocks(space, "kv-only", prompt_b, cache, detached=False)
        longer = example.reuse(space, cfg, prompt_b, repeats=1)
        assert (longer["hit_tokens"], longer["resume_tokens"]) == (512, 448)
        assert longer["computed_tokens"] == 520 - 448
        assert_equal_to_recompute(longer)
