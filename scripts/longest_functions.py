#!/usr/bin/env python3
"""Lists the longest function definitions in the C++ sources (*.cc).

No compiler needed: the script strips comments, string and character
literals and preprocessor lines, then matches braces. A '{' at namespace or
class level opens a function body when the text before it (back to the last
';', '{' or '}' at that level) holds a parameter list and is not a
namespace/class/struct/union/enum head or an initializer ("= {"). A
function's length runs from the first line of its head (return type,
template line) to its closing brace, lambdas and local classes included.

  scripts/longest_functions.py                  # top 20 outside bench/ and cuda_ops/
  scripts/longest_functions.py --top 5 --max 80 # exit 1 when any is over 80 lines
  scripts/longest_functions.py --exclude scheduler/ --exclude storage/

Excluded always: build*/, data/, .git/. Excluded by default: bench/ and the
kernels (cuda_ops/); --include-all scans them too.
"""

import argparse
import os
import re
import sys

CONTAINER = re.compile(r'\b(namespace|class|struct|union|enum)\b|\bextern\s*"')
DEFAULT_EXCLUDES = ["bench/", "cuda_ops/"]


def strip(text):
    """Blanks comments, literals and preprocessor lines, keeping newlines."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if at_line_start and c == "#":
            # A preprocessor line, with its backslash continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end))
            i = end
            continue
        m = re.match(r'(?:u8|u|U|L)?R"([^(\s]*)\(', text[i:i + 40])
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = ")" + m.group(1) + '"'
            end = text.find(close, i + m.end())
            end = n if end < 0 else end + len(close)
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
            continue
        if c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        if c == "\n":
            at_line_start = True
        out.append(c)
        i += 1
    return "".join(out)


def functions(path, rel):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip(f.read())
    line_of = []  # line number of each char
    line = 1
    for ch in text:
        line_of.append(line)
        if ch == "\n":
            line += 1
    found = []

    def skip_block(i):
        depth = 0
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return i
            i += 1
        return len(text) - 1

    def scan(start, end):
        head_start = start
        i = start
        while i < end:
            c = text[i]
            if c in ";}":
                head_start = i + 1
            elif c == "{":
                head = text[head_start:i]
                close = skip_block(i)
                stripped = head.strip()
                if CONTAINER.search(head) and "(" not in head.split("{")[0].split("=")[0] \
                        or re.search(r'\bnamespace\b', head):
                    scan(i + 1, close)
                elif "(" in head and not re.search(r"=\s*$", stripped) and stripped:
                    first = head_start + (len(head) - len(head.lstrip()))
                    name = re.findall(r"([~\w:<>]+)\s*\(", head)
                    found.append((line_of[close] - line_of[first] + 1, rel,
                                  line_of[first], name[0] if name else "?"))
                i = close
                head_start = i + 1
            i += 1

    scan(0, len(text))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--top", type=int, default=20, help="how many to list (0: all)")
    ap.add_argument("--max", type=int, default=0,
                    help="exit 1 when a function is longer than this many lines")
    ap.add_argument("--exclude", action="append", default=[],
                    help="a path prefix to skip (repeatable)")
    ap.add_argument("--only", action="append", default=[],
                    help="scan only paths with this prefix (repeatable)")
    ap.add_argument("--include-all", action="store_true",
                    help="scan bench/ and cuda_ops/ too")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    excludes = list(args.exclude) + ([] if args.include_all else DEFAULT_EXCLUDES)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames
                             if not (rel_dir == "." and (d.startswith("build") or d in ("data", ".git"))))
        for fn in sorted(filenames):
            if not fn.endswith(".cc"):
                continue
            rel = os.path.normpath(os.path.join(rel_dir, fn))
            if any(rel.startswith(e) for e in excludes):
                continue
            if args.only and not any(rel.startswith(o) for o in args.only):
                continue
            found.extend(functions(os.path.join(dirpath, fn), rel))
    found.sort(key=lambda f: (-f[0], f[1], f[2]))
    shown = found if args.top == 0 else found[:args.top]
    for length, rel, line, name in shown:
        print(f"{length:5d}  {rel}:{line}  {name}")
    over = [f for f in found if args.max and f[0] > args.max]
    if args.max:
        print(f"{len(over)} function(s) over {args.max} lines", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
