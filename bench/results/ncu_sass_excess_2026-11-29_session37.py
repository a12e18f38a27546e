import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
# find the header row (contains "Source")
hi = next(i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r))
h = rows[hi]
print("columns:", h[:40])
def col(name):
    for i, c in enumerate(h):
        if c.strip().startswith(name):
            return i
    return None
src = col("Source")
keys = [k for k in ("L1 Wavefronts Shared Excessive", "L2 Theoretical Sectors Global Excessive", "L1 Wavefronts Shared Ideal", "L1 Wavefronts Shared", "Warp Stall Sampling (All Samples)", "Instructions Executed") if col(k) is not None]
print("keys", keys)
def num(x):
    try: return float(x.replace(",", ""))
    except: return 0.0
body = rows[hi + 1:]
for k in keys[:2]:
    c = col(k)
    top = sorted(body, key=lambda r: -num(r[c]) if len(r) > c else 0)[:25]
    print("== top by", k, "total", sum(num(r[c]) for r in body if len(r) > c))
    for r in top:
        if len(r) > c and num(r[c]) > 0:
            print(int(num(r[c])), "|", " ".join(f"{kk}={r[col(kk)]}" for kk in keys[2:] if len(r) > col(kk)), "|", r[src][:110])
# stall top
c = col("Warp Stall Sampling (All Samples)")
if c is not None:
    tot = sum(num(r[c]) for r in body if len(r) > c)
    print("== top stalls, total samples", tot)
    for r in sorted(body, key=lambda r: -num(r[c]) if len(r) > c else 0)[:30]:
        print(int(num(r[c])), "|", r[src][:110])
