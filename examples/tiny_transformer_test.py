"""Runs examples/tiny_transformer.py against a real kvtierd and checks what it proves.

Process A and process B are separate processes (neither is this one); B's logits over the
tokens it computed must equal a full recompute within fp32 tolerance, after a hit of exactly
the block-aligned shared prefix.
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


def tagged(output, tag):
    lines = [line for line in output.splitlines() if line.startswith(tag + " ")]
    assert len(lines) == 1, output
    return json.loads(lines[0][len(tag) + 1 :])


def test_cached_kv_from_another_process_gives_the_same_logits(daemon):
    run = subprocess.run(
        [sys.executable, EXAMPLE, "--socket", daemon.socket],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(run.stdout)
    print(run.stderr, file=sys.stderr)
    assert run.returncode == 0, run.stderr
    put, result = tagged(run.stdout, "PUT"), tagged(run.stdout, "RESULT")
    # Two processes of their own.
    assert len({put["pid"], result["pid"], os.getpid()}) == 3
    # A sealed its 31 full blocks; B hit the 28 whole blocks of the 460 shared tokens.
    assert (put["tokens"], put["sealed"]) == (500, 31)
    assert (result["hit_tokens"], result["hit_blocks"]) == (448, 28)
    assert result["computed_tokens"] == 520 - 448
    # B's logits equal a full recompute within fp32 tolerance (and so does the KV it loaded).
    assert result["equal"] and result["max_abs_diff"] <= result["tolerance"] == 1e-4
    assert result["kv_max_abs_diff"] <= 1e-4 and result["same_next_tokens"]
    # A's blocks outlived A's session: all 31 full blocks of its prompt still hit.
    example = load_example()
    prompt_a, _ = example.prompts(example.CONFIG)
    with kvtier.Client(daemon.socket) as client:
        space = client.open(example.layout_for(example.CONFIG))
        with space.lookup(prompt_a.tolist()) as hit:
            assert hit.matched_tokens == 496
