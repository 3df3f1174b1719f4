#!/usr/bin/python3
"""Compiles the C and C++ snippets of kvtier's Markdown documents against the real headers.

  doc_snippets.py --cxx CXX --cc CC -I DIR ... [--llama-include DIR ...] FILE.md ...

Every fenced block tagged cpp, c++ or c is a snippet and must compile. A snippet is code from the
middle of a program: it is put inside a function body, after declarations of the names the
documents take as given (an engine's prompt, its KV buffers, a connected client, an open space;
PRELUDES below), and checked with `-fsyntax-only -Wall -Wextra -Werror` (unused names allowed).
Its `#include` lines go to the top of the file; a file's snippets build one program, so a snippet
sees the includes of the snippets before it in the same document, and one in a document that
includes "kvtier/llama.h" is given the llama.cpp names (ctx, cparams, tokens as llama_token).
The compiler's messages name the Markdown file and line (#line).

A snippet that is deliberately not code is preceded by a line `<!-- snippet: not compiled:
REASON -->`. Without the llama.cpp headers (--llama-include), snippets that need them are skipped
and said so. Exit 0 when every snippet compiles, 1 when one does not (or none was found).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\S*)\s*$")
SKIP = re.compile(r"^<!--\s*snippet:\s*not compiled:")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')

# The names the documents use without declaring them, each with the type its snippets give it.
SDK_PRELUDE = """\
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include "kvtier/client.h"
void useBlock(std::span<const uint8_t> bytes);
void useEmbedding(std::span<const uint8_t> bytes);
"""
SDK_LOCALS = """\
  std::unique_ptr<kvtier::Client> client;
  std::unique_ptr<kvtier::Space> space, spaceOnA, spaceOnB;
  kvtier::Layout layout;
  std::string sock;
  std::vector<uint32_t> prompt, nextPrompt, otherPrompt, tokens, toolTokens;
  uint32_t next = 0;
  uint64_t len = 0, ssmStateBytes = 0;
  std::vector<uint8_t> kv, kvNext, toolKv, out, state, partialKv, ssmState, imageBytes, embedding;
  std::vector<void*> kCachePerLayer, vCachePerLayer;
  std::vector<int32_t> blockTable;
  void* stream = nullptr;
"""
LLAMA_PRELUDE = SDK_PRELUDE + '#include "kvtier/llama.h"\n'
LLAMA_LOCALS = """\
  llama_context* ctx = nullptr;
  llama_context_params cparams = llama_context_default_params();
  std::unique_ptr<kvtier::llama::PrefixCache> cache;
  std::vector<llama_token> prompt;
"""
C_PRELUDE = """\
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
"""
C_LOCALS = """\
  uint32_t tokens[64] = {0}, prompt[64] = {0};
  size_t n = 64, m = 64;
  static uint8_t kv[64 * 131072], out[64 * 131072];
"""


class Snippet:
    def __init__(self, path, line, lang, lines, includes):
        self.path, self.line, self.lang = path, line, lang
        self.lines = lines  # the block's lines, its #include lines blanked
        self.includes = includes  # this document's includes so far, this snippet's included


def snippets_of(path, skipped):
    """The compiled snippets of one Markdown file; skipped ones are appended to `skipped`."""
    with open(path, encoding="utf-8") as f:
        text = f.read().split("\n")
    found, includes, i = [], [], 0
    while i < len(text):
        m = FENCE.match(text[i])
        if not m:
            i += 1
            continue
        lang = m.group(1).lower()
        end = i + 1
        while end < len(text) and not text[end].startswith("```"):
            end += 1
        body = text[i + 1:end]
        if lang in ("cpp", "c++", "c"):
            if i > 0 and SKIP.match(text[i - 1]):
                skipped.append(f"{path}:{i + 2}: marked not compiled")
            else:
                lines = []
                for line in body:
                    inc = INCLUDE.match(line)
                    if inc:
                        if inc.group(1) not in includes:
                            includes.append(inc.group(1))
                        line = ""
                    lines.append(line)
                found.append(Snippet(os.path.relpath(path), i + 2, "c" if lang == "c" else "c++",
                                     lines, list(includes)))
        i = end + 1
    return found


def program(snippets, prelude, scopes, c):
    """One translation unit: each snippet a function, its lines where the document has them.
    `scopes`: the given names, each list in a block of its own (a later one may shadow)."""
    out = [prelude]
    for s in snippets:
        out += [f"#include <{inc}>" for inc in s.includes]
    for k, s in enumerate(snippets):
        out.append(f"int snippet{k}({'void' if c else ''}) {{")
        for names in scopes:
            out += ["{", names]
        out.append("{")
        out.append(f'#line {s.line} "{s.path}"')
        out += s.lines
        out.append("}" * (len(scopes) + 1))
        out.append("  return 0;")
        out.append("}")
    return "\n".join(out) + "\n"


def compile_program(compiler, lang, source, flags):
    with tempfile.NamedTemporaryFile("w", suffix=".c" if lang == "c" else ".cc") as f:
        f.write(source)
        f.flush()
        std = "-std=c99" if lang == "c" else "-std=c++20"
        cmd = [compiler, std, "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
               "-Wno-unused-variable", "-Wno-unused-but-set-variable", "-Wno-unused-parameter",
               *flags, "-x", lang, f.name]
        return subprocess.run(cmd, capture_output=True, text=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cxx", required=True)
    p.add_argument("--cc", required=True)
    p.add_argument("-I", dest="include", action="append", default=[])
    p.add_argument("--llama-include", action="append", default=[])
    p.add_argument("files", nargs="+")
    args = p.parse_args()

    skipped, groups = [], {"sdk": [], "llama": [], "c": []}
    for path in args.files:
        for s in snippets_of(path, skipped):
            if s.lang == "c":
                groups["c"].append(s)
            elif "kvtier/llama.h" in s.includes:
                groups["llama"].append(s)
            else:
                groups["sdk"].append(s)
    count = sum(len(g) for g in groups.values())
    if count == 0:
        print("doc_snippets: no C or C++ snippet found in " + " ".join(args.files))
        return 1
    if groups["llama"] and not args.llama_include:
        skipped += [f"{s.path}:{s.line}: needs llama.cpp's headers (not found)"
                    for s in groups["llama"]]
        count -= len(groups["llama"])
        groups["llama"] = []

    incs = [f"-I{d}" for d in args.include]
    failed = False
    # The llama.cpp names in a block inside the SDK's: its `prompt` (of llama_token) shadows.
    for name, prelude, scopes, compiler, lang, flags in (
            ("sdk", SDK_PRELUDE, [SDK_LOCALS], args.cxx, "c++", incs),
            ("llama", LLAMA_PRELUDE, [SDK_LOCALS, LLAMA_LOCALS], args.cxx, "c++",
             incs + [f"-I{d}" for d in args.llama_include]),
            ("c", C_PRELUDE, [C_LOCALS], args.cc, "c", incs)):
        snippets = groups[name]
        if not snippets:
            continue
        r = compile_program(compiler, lang, program(snippets, prelude, scopes, lang == "c"),
                            flags)
        where = ", ".join(f"{os.path.basename(s.path)}:{s.line}" for s in snippets)
        if r.returncode != 0:
            failed = True
            print(f"FAILED: {len(snippets)} {name} snippet(s) ({where}):\n{r.stderr}")
        else:
            print(f"ok: {len(snippets)} {name} snippet(s) compile ({where})")
    for s in skipped:
        print("skipped: " + s)
    print(f"doc_snippets: {count} snippet(s) checked, {'a failure' if failed else 'all compile'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
