#!/usr/bin/env python3
"""Static check: no allocation in src/ computes its size with an unchecked multiply.

Every `count * size` handed to an allocator must go through the checked multiply of
src/core/internal.h (mp_mul_size, or the helpers mp_alloc_array / mp_calloc_array /
mp_realloc_array built on it). This script reads every C source and header under src/, strips
comments and string literals, finds each call of malloc, realloc and calloc, and refuses one whose
size argument (malloc's argument, realloc's second, either of calloc's: calloc checks the product
of its two arguments itself, not a product inside one of them) contains a binary `*`; for the
helpers, the count argument must hold none. `sizeof *p`
(a dereference) and casts are not multiplications and are ignored.

What it cannot see: a size multiplied into a variable earlier (`size_t n = a * b; malloc(n)`); such
sites are reviewed by hand and use mp_mul_size (see the comment at each).

Usage: check_alloc_sizes.py [SRC_DIR]        exit 1 and list file:line for each unchecked size
       check_alloc_sizes.py --self-test      checks the checker on known good and bad snippets
"""
import os
import re
import sys

# allocator -> the arguments that must hold no unchecked multiply (the helpers' counts: their element
# size argument may be a constant multiple of a sizeof, which they multiply checked)
ALLOCATORS = {"malloc": (0,), "realloc": (1,), "calloc": (0, 1),
              "mp_alloc_array": (0,), "mp_calloc_array": (0,), "mp_realloc_array": (1,)}
CALL = re.compile(r"\b(malloc|calloc|realloc|mp_alloc_array|mp_calloc_array|mp_realloc_array)\s*\(")
CAST = re.compile(r"\(\s*(?:const\s+)?(?:unsigned\s+)?(?:size_t|int|long|char|u?int(?:8|16|32|64)_t|uint8_t)\s*\)")
SIZEOF_DEREF = re.compile(r"\bsizeof\s*\*\s*[A-Za-z_][\w.]*(?:->\w+)*")
SIZEOF_PAREN = re.compile(r"\bsizeof\s*\(")
# a binary multiply: `*` after an operand (identifier, number, closing bracket)
BINARY_MUL = re.compile(r"[\w\)\]]\s*\*")


def strip_comments_and_strings(text):
    """Replaces comments, string and character literals by spaces, keeping newlines (line numbers)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1 : j - 1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def call_arguments(text, open_paren):
    """(text, index of '(') -> (list of top-level argument strings, index after ')')."""
    depth, args, start, i = 0, [], open_paren + 1, open_paren
    while i < len(text):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append(text[start:i])
                return args, i + 1
        elif c == "," and depth == 1:
            args.append(text[start:i])
            start = i + 1
        i += 1
    return args, len(text)


def remove_sizeof_paren(arg):
    """Drops every `sizeof(...)` (balanced), which is a size, not a product."""
    while True:
        m = SIZEOF_PAREN.search(arg)
        if not m:
            return arg
        _, end = call_arguments(arg, m.end() - 1)
        arg = arg[: m.start()] + " S " + arg[end:]


def unchecked_multiply(arg):
    arg = remove_sizeof_paren(SIZEOF_DEREF.sub(" S ", arg))
    arg = CAST.sub(" ", arg)
    return BINARY_MUL.search(arg) is not None


def check_text(text):
    """(C source) -> [(line, call text)] of allocations with an unchecked multiply."""
    clean = strip_comments_and_strings(text)
    found = []
    for m in CALL.finditer(clean):
        args, end = call_arguments(clean, m.end() - 1)
        sizes = [args[k] for k in ALLOCATORS[m.group(1)] if k < len(args)]
        if any(unchecked_multiply(a) for a in sizes):
            line = clean.count("\n", 0, m.start()) + 1
            found.append((line, " ".join(clean[m.start() : end].split())))
    return found


def self_test():
    bad = [
        "p = malloc(n * sizeof *p);",
        "p = malloc((size_t)(cells ? cells : 1) * sizeof *p);",
        "p = realloc(p, cap * sizeof(int64_t));",
        "p = calloc(n * 2, sizeof *p);",
        "p = malloc(sizeof(int) * n);",
        "p = malloc(a\n * b);",
        "p = malloc((size_t)h * W * 3);",
        "p = malloc(2 * n);",
        "p = mp_alloc_array(a * b, sizeof *p);",
        "p = mp_realloc_array(p, 2 * n, 4);",
    ]
    good = [
        "p = malloc(sizeof *p);",
        "p = malloc(bytes);",
        "p = calloc(n, sizeof *p);",
        "p = calloc(1, sizeof(struct x));",
        "p = realloc(p, bytes);",
        "p = malloc(*len);",
        "p = malloc(n + 1);",
        "p = mp_alloc_array(n, 4); /* malloc(n * 4) in a comment */",
        "p = mp_alloc_array(n, 2 * sizeof *p);",
        'puts("malloc(a * b)");',
        "p = malloc((size_t)*len);",
    ]
    failures = [s for s in bad if not check_text(s)] + [s for s in good if check_text(s)]
    for s in failures:
        print("self-test: wrong verdict for %r" % s)
    # the lines reported are the lines of the calls
    assert check_text("int a;\n\nx = malloc(n * 8);\n")[0][0] == 3
    print("self-test: %d bad and %d good snippets judged right" % (len(bad), len(good)) if not failures else "")
    return 1 if failures else 0


def main(argv):
    if argv[1:2] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    problems, files = [], 0
    for dirpath, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(dirpath, name)
            files += 1
            with open(path, encoding="utf-8", errors="replace") as f:
                for line, call in check_text(f.read()):
                    problems.append("%s:%d: unchecked multiply in an allocation size: %s" % (path, line, call))
    for p in problems:
        print(p)
    if files == 0:
        print("no C sources under %s" % root)
        return 1
    print("%d files, %d allocations with an unchecked size" % (files, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
