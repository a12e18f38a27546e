"""Writes test_fa_sample.py: FlashAttention's test_flash_attn.py with each test's parametrize
product replaced by a fixed random sample of M combinations (README.md):
python3 sample.py [M [SEED]] (SEED 1 by default: another seed draws another sample).
A parametrize whose list is `A if cond else B` takes B (FlashAttention's non-sm75 branch)."""
import ast
import random
import sys


def sample_product(values, m, rng):
    """m index tuples drawn without repeats from the product of len(v) for v in values."""
    sizes = [len(v) for v in values]
    total = 1
    for s in sizes:
        total *= s
    picks = range(total) if total <= m else sorted(rng.sample(range(total), m))
    for p in picks:
        idx = []
        for s in reversed(sizes):
            idx.append(p % s)
            p //= s
        yield tuple(values[i][j] for i, j in enumerate(reversed(idx)))


def main():
    m = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    src = open("test_flash_attn.py").read()
    lines = src.split("\n")
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    edits = []  # (first line, end line, replacement lines)
    for f in ast.parse(src).body:
        if not (isinstance(f, ast.FunctionDef) and f.name.startswith("test_")):
            continue
        decos = [d for d in f.decorator_list if isinstance(d, ast.Call)
                 and getattr(d.func, "attr", "") == "parametrize"]
        if not decos:
            continue
        names, values = [], []
        for d in decos:
            v = d.args[1].orelse if isinstance(d.args[1], ast.IfExp) else d.args[1]
            names.append(d.args[0].value)
            values.append([ast.get_source_segment(src, e) for e in v.elts])
        rows = []
        for combo in sample_product(values, m, rng):  # "a,b" names take a tuple, unpacked
            rows.append("(" + ", ".join(val if "," not in n else f"*{val}"
                                        for n, val in zip(names, combo)) + ",)")
        first = min(d.lineno for d in decos) - 1
        end = max(d.end_lineno for d in decos)
        inside = lambda i: any(d.lineno - 1 <= i < d.end_lineno for d in decos)  # noqa: E731
        kept = [lines[i] for i in range(first, end) if not inside(i)]  # comments, skipif
        edits.append((first, end, kept + [f'@pytest.mark.parametrize("{",".join(names)}", [\n    '
                                          + ",\n    ".join(rows) + "])"]))
    for first, end, new in sorted(edits, reverse=True):
        lines[first:end] = new
    open("test_fa_sample.py", "w").write("\n".join(lines))


if __name__ == "__main__":
    main()
