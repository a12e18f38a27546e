"""Session 35's variants of forward kernels dumped by FLASHJIT_DUMP_DIR, run through
FLASHJIT_OVERRIDE_DIR (bench/results/README.md, session 35): pcvt (P to bf16 by an
integer add and a byte permute, off the XU pipe), poly (pcvt + every 4th fragment's exp2
by a cubic on the FMA pipe), nostore (O's stores deleted: the compiler then deleted most
of the kernel, so it bounds nothing), nostore2 (O's stores behind a run-time false test:
the bound on what O's stores cost). Their results are wrong on purpose where they skip
stores. usage: this.py SRC_DIR DST_DIR VARIANT"""
import os, re, sys
src, dst, var = sys.argv[1:4]
os.makedirs(dst, exist_ok=True)
HELP = r'''
FJ_DEVICE fj_bits fj_p_to_bf16(float x) { return fj_bits((__float_as_uint(x) + 0x8000u) >> 16); }
FJ_DEVICE float fj_exp2_poly(float x) {
  float xc;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(xc) : "f"(x), "f"(-127.0f));
  const float t = __fadd_rn(xc, 12582912.0f);
  const float j = __fadd_rn(t, -12582912.0f);
  const float f = __fadd_rn(xc, -j);
  const float p = fmaf(fmaf(fmaf(0.05500892922282219f, f, 0.24221095442771912f), f, 0.6932829022407532f), f, 1.0f);
  const float s = __uint_as_float((__float_as_uint(t) << 23) + 0x3f800000u);
  return p * s;
}
'''
for name in os.listdir(src):
    if not (name.startswith("fa_fwd") and name.endswith(".hip")): continue
    lines = open(os.path.join(src, name)).read().split("\n")
    out = []
    p_srcs = set()
    # find P conversions: a convert op followed by a convert_layout
    irs = [(i, l) for i, l in enumerate(lines) if "// IR: %" in l]
    conv_lines = set()
    for k, (i, l) in enumerate(irs):
        m = re.search(r"// IR: %(\d+) = convert %(\d+)$", l.strip())
        if m and k + 1 < len(irs) and "convert_layout" in irs[k + 1][1]:
            for j in range(i, irs[k + 1][0]):
                conv_lines.add(j)
                mm = re.search(r"fj_from_f32\((t\d+)\[", lines[j])
                if mm: p_srcs.add(mm.group(1))
    for i, l in enumerate(lines):
        if i in conv_lines and var in ("pcvt", "poly"):
            l = l.replace("fj_from_f32(", "fj_p_to_bf16(")
        if var == "nostore" and "fj_global_store2(dst + d0" in l:
            l = l.split("fj_global_store2")[0] + "{}"
        if var == "nostore2" and "if (row < seqlen_q) {" in l and any("IR: store" in x for x in lines[max(0, i - 30):i]):
            l = l.replace("if (row < seqlen_q) {", "if (row < seqlen_q && seqlen_k < 0) {")
        if var == "poly":
            m = re.match(r"(\s*)(t\d+)\[qt\]\[c\]\[e\] = fj_exp2\((t\d+)\[qt\]\[c\]\[e\]\);", l)
            if m and m.group(2) in p_srcs:
                l = f"{m.group(1)}{m.group(2)}[qt][c][e] = c % 4 == 3 ? fj_exp2_poly({m.group(3)}[qt][c][e]) : fj_exp2({m.group(3)}[qt][c][e]);"
        out.append(l)
        if l.startswith("FJ_DEVICE fj_bits fj_from_f32("):
            out.append(HELP)
    open(os.path.join(dst, name), "w").write("\n".join(out))
    print(name, "p tiles", sorted(p_srcs), "converted lines", len(conv_lines))
