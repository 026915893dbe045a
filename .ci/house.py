#!/usr/bin/env python3
"""The house rules `.ci/run` enforces on the source of both crates:

* no source file has more than 500 lines (docs and unit tests included);
* the top-level modules of `tower-rate-tier/src` depend on each other in
  one direction: every `crate::<module>` path in code (comments and strings
  aside, `use` lines or not) is an edge, and the graph has no cycle.

Prints the module order it found, or what is wrong, and exits non-zero on
a violation.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRATES = [ROOT / "tower-rate-tier" / "src", ROOT / "tower-rate-tier-macros" / "src"]
MAX_LINES = 500
failed = False

for crate in CRATES:
    for path in sorted(crate.rglob("*.rs")):
        lines = path.read_text().count("\n")
        if lines > MAX_LINES:
            print(f"FAIL: {path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES})")
            failed = True


def code_only(text):
    """The text without comments and string literals."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return text


src = CRATES[0]
top = {}
for path in src.iterdir():
    name = path.stem if path.is_file() else path.name
    if path.suffix == ".rs" or path.is_dir():
        if name in ("lib", "main"):
            continue
        files = [path] if path.is_file() else sorted(path.rglob("*.rs"))
        top[name] = files

edges = {m: set() for m in top}
for module, files in top.items():
    for path in files:
        for other in re.findall(r"\bcrate::(\w+)", code_only(path.read_text())):
            if other != module and other in top:
                edges[module].add(other)

# `__private` re-exports what macro expansions need: it sits on top.
order, state = [], {}


def visit(m, stack):
    global failed
    if state.get(m) == "done":
        return
    if state.get(m) == "open":
        cycle = stack[stack.index(m):] + [m]
        print("FAIL: module cycle: " + " -> ".join(cycle))
        failed = True
        return
    state[m] = "open"
    for d in sorted(edges[m]):
        visit(d, stack + [m])
    state[m] = "done"
    order.append(m)


for m in sorted(top):
    visit(m, [])

if failed:
    sys.exit(1)
print("house: no file over", MAX_LINES, "lines; modules, each after what it uses:")
print("  " + " -> ".join(order))
