#!/bin/sh
# Layout figures of the engine (issue 51): Volume's fields and methods,
# its impl blocks, the longest functions, the largest files, the engine's
# share of the workspace's lines and the cloud checks of volume/.
# Run from anywhere: `scripts/layout-figures.sh [REPO]`; prints plain text.
# Method: a small Rust-aware scan (strings, chars and comments skipped,
# braces counted), no build needed. "Lines" of a function run from its
# `fn` line to its closing brace; "code lines" leave out blank lines and
# lines that hold only a comment.
set -eu
repo=${1:-$(cd "$(dirname "$0")/.." && pwd)}
exec python3 - "$repo" <<'PY'
import os, re, sys
repo = sys.argv[1]
engine = os.path.join(repo, "crates/cairn-engine/src")

def strip(text):
    """The text with comments, strings and char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j): depth += 1; j += 2
                elif text.startswith("*/", j): depth -= 1; j += 2
                else: j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif re.match(r'b?r(#*)"', text[i:i+40]) and (i == 0 or not (text[i-1].isalnum() or text[i-1] == "_")):
            m = re.match(r'b?r(#*)"', text[i:i+40])
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:i+12])
            if m:
                out.append(" " * m.end()); i += m.end()
            else:
                out.append(c); i += 1
        else:
            out.append(c); i += 1
    return "".join(out)

def rs_files(root):
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith(".rs"):
                yield os.path.join(d, f)

def close_of(code, open_at):
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == "{": depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0: return k
    return len(code) - 1

def line_of(code, at):
    return code.count("\n", 0, at) + 1

FN = re.compile(r"\bfn\s+([A-Za-z_]\w*)")

def functions(code):
    """(name, first line, lines) of every fn with a body."""
    for m in FN.finditer(code):
        k = m.end()
        depth = 0
        while k < len(code):
            ch = code[k]
            if ch in "(<[": depth += 1
            elif ch in ")>]": depth -= 1
            elif ch == ";" and depth <= 0: k = -1; break
            elif ch == "{" and depth <= 0: break
            k += 1
        if k < 0 or k >= len(code): continue
        end = close_of(code, k)
        a, b = line_of(code, m.start()), line_of(code, end)
        yield m.group(1), a, b - a + 1

def code_lines(text):
    return sum(1 for l in strip(text).splitlines() if l.strip())

texts = {p: open(p, encoding="utf-8").read() for p in rs_files(engine)}
stripped = {p: strip(t) for p, t in texts.items()}
rel = lambda p: os.path.relpath(p, repo)

# Volume: its fields, and the methods of every `impl Volume` block.
mod = os.path.join(engine, "volume/mod.rs")
code = stripped[mod]
m = re.search(r"pub struct Volume\s*\{", code)
body = code[m.end():close_of(code, m.end() - 1)]
depth, fields, crate_fields = 0, 0, 0
for l in body.splitlines():
    if depth == 0:
        f = re.match(r"\s*(pub(\([^)]*\))?\s+)?([a-z_]\w*)\s*:", l)
        if f:
            fields += 1
            crate_fields += bool(f.group(2) and "crate" in f.group(2))
    depth += l.count("{") + l.count("(") + l.count("<") - l.count("}") - l.count(")") - l.count(">")
blocks, block_files, methods, crate_methods, pub_methods = 0, set(), 0, 0, 0
for p, c in stripped.items():
    for b in re.finditer(r"\bimpl\s+Volume\s*\{", c):
        blocks += 1; block_files.add(rel(p))
        inner = c[b.end():close_of(c, b.end() - 1)]
        d = 0
        for l in inner.splitlines():
            if d == 0:
                f = re.match(r"\s*(pub(\([^)]*\))?\s+)?(const\s+|unsafe\s+)*fn\s", l)
                if f:
                    methods += 1
                    if f.group(2) and "crate" in f.group(2): crate_methods += 1
                    elif f.group(1): pub_methods += 1
            d += l.count("{") - l.count("}")
print(f"Volume: {fields} fields ({crate_fields} pub(crate)); {methods} methods ({pub_methods} pub, {crate_methods} pub(crate)) in {blocks} `impl Volume` blocks across {len(block_files)} files")

# The parts beside Volume: every struct of volume/ with its field count, for the after picture.
parts = []
for p, c in stripped.items():
    if "/volume/" not in p: continue
    for s in re.finditer(r"pub(\(crate\))?\s+struct\s+(\w+)\s*\{", c):
        inner = c[s.end():close_of(c, s.end() - 1)]
        d, n = 0, 0
        for l in inner.splitlines():
            if d == 0 and re.match(r"\s*(pub(\([^)]*\))?\s+)?[a-z_]\w*\s*:", l): n += 1
            d += l.count("{") + l.count("(") + l.count("<") - l.count("}") - l.count(")") - l.count(">")
        if n >= 8: parts.append((n, s.group(2), rel(p)))
print("structs of volume/ with 8 fields or more: " + ", ".join(f"{name} {n} ({path})" for n, name, path in sorted(parts, reverse=True)))

# Which volume/ files write FileInner's fields (`g.FIELD =` on a locked inner) outside file.rs.
print()
print("the 10 longest functions of the engine (lines):")
fns = []
for p, c in stripped.items():
    for name, a, n in functions(c):
        fns.append((n, f"{rel(p)}:{a} {name}"))
# A fn inside a fn is counted in both; the outer one is the longer.
for n, w in sorted(fns, reverse=True)[:10]:
    print(f"  {n:5} {w}")
print("the 10 largest files of the engine (lines):")
for n, p in sorted(((t.count("\n"), rel(p)) for p, t in texts.items()), reverse=True)[:10]:
    print(f"  {n:5} {p}")

# The engine's share of the workspace (src/ of every crate; third_party/ is not ours).
tot_lines = tot_code = eng_lines = eng_code = 0
for p in rs_files(os.path.join(repo, "crates")):
    if "/src/" not in p: continue
    t = open(p, encoding="utf-8").read()
    l, c = t.count("\n"), code_lines(t)
    tot_lines += l; tot_code += c
    if p.startswith(engine): eng_lines += l; eng_code += c
print()
print(f"engine src/: {eng_lines} lines of {tot_lines} in the workspace's crates' src/ ({100*eng_lines/tot_lines:.0f}%); code lines {eng_code} of {tot_code} ({100*eng_code/tot_code:.0f}%)")

# Cloud checks of the volume's code: `self.cloud` / `.cloud.is_some()` / `is_cloud` style tests.
pat = re.compile(r"\bcloud\s*\.\s*(is_some|is_none|as_ref|as_deref)\b|\bif let Some\([^)]*\)\s*=\s*&?self\.cloud\b|\bis_cloud\b|match\s+&?self\.cloud\b")
hits = {rel(p): len(pat.findall(c)) for p, c in stripped.items() if "/volume/" in p}
hits = {p: n for p, n in hits.items() if n}
print(f"cloud checks in volume/: {sum(hits.values())} across {len(hits)} files")
PY
