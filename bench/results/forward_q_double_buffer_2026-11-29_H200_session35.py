"""Hand edit of a persistent sm90 forward: Q double-buffered, the tile after next's Q
issued when a tile's loop ends. usage: qdouble.py IN OUT"""
import re, sys
s = open(sys.argv[1]).read()
def rep(old, new, count=1):
    global s
    assert s.count(old) == count, (old, s.count(old))
    s = s.replace(old, new)
m = re.search(r"FJ_DYNAMIC_LDS_ARRAY\(fj_bits, lds_q, (\d+), 0\);", s)
qn = int(m.group(1))
rep(m.group(0), m.group(0).replace("lds_q,", "lds_q0,") +
    f"\n  __shared__ __align__(1024) unsigned long long fj_q1_store[({qn} * 2 + 1024) / 8];"
    f"\n  fj_bits *const lds_q1 = reinterpret_cast<fj_bits *>(fj_q1_store);"
    f"\n  unsigned long long *const fj_qbar1 = fj_q1_store + {qn} * 2 / 8;"
    f"\n  unsigned fj_q1_phase = 0;")
rep("  fj_tma_init(fj_tma_bar, 5);", "  fj_mbar_init(fj_qbar1, 1, 1);\n  fj_tma_init(fj_tma_bar, 5);")
# consumers' tile loop
i = s.index("fj_setmaxnreg_inc<")
head, tail = s[:i], s[i:]
tail = tail.replace("  for (long fj_tile = fj_group_id_x();", "  int fj_it = 0;\n  for (long fj_tile = fj_group_id_x();", 1)
tail = tail.replace("    const int batch = int(fj_tile / fj_q_blocks / heads);\n",
    "    const int batch = int(fj_tile / fj_q_blocks / heads);\n    fj_bits *const lds_q = (fj_it & 1) ? lds_q1 : lds_q0;\n", 1)
# first tile: also the second tile's Q
m = re.search(r"( +)if \(fj_thread_id\(\) == 0\)\n +fj_tma_tile\((tmap_Q_\d+), lds_q, &fj_tma_bar\[0\], (\d+), (\d+), \(q_block\) \* kBlockM, head, batch\);\n", tail)
ind, tm, pan, rows = m.group(1), m.group(2), m.group(3), m.group(4)
second = (f"{ind}if (fj_thread_id() == 0 && fj_tile + fj_group_count_x() < fj_tiles) {{ // the second tile's Q\n"
          f"{ind}  const long fj_next = fj_tile + fj_group_count_x();\n"
          f"{ind}  fj_tma_tile({tm}, lds_q1, fj_qbar1, {pan}, {rows}, int(fj_next % fj_q_blocks) * kBlockM, int(fj_next / fj_q_blocks % heads), int(fj_next / fj_q_blocks / heads));\n"
          f"{ind}}}\n")
tail = tail.replace(m.group(0), m.group(0) + second, 1)
old = "fj_tma_wait(fj_tma_bar, 0, fj_tma_phase); // this thread sees the Q tile"
assert tail.count(old) == 1
tail = tail.replace(old, "if (fj_it & 1) fj_tma_wait(fj_qbar1, 0, fj_q1_phase); else fj_tma_wait(fj_tma_bar, 0, fj_tma_phase); // this thread sees the Q tile")
# after the loop: the tile after next's Q into this tile's copy
m = re.search(r"if \(fj_tile \+ fj_group_count_x\(\) < fj_tiles\) \{ // the next tile's Q\n( +)const long fj_next = fj_tile \+ fj_group_count_x\(\);", tail)
tail = tail.replace(m.group(0), f"if (fj_tile + 2 * fj_group_count_x() < fj_tiles) {{ // the tile after next's Q\n{m.group(1)}const long fj_next = fj_tile + 2 * fj_group_count_x();", 1)
j = tail.index("the tile after next's Q")
m = re.search(r"fj_tma_tile\((tmap_Q_\d+), lds_q, &fj_tma_bar\[0\], ", tail[j:])
tail = tail[:j] + tail[j:].replace(m.group(0), f"fj_tma_tile({m.group(1)}, lds_q, (fj_it & 1) ? fj_qbar1 : &fj_tma_bar[0], ", 1)
# count tiles: before the closing of the tile loop: find the last "  }\n}\n" of the kernel
k = tail.rstrip().rfind("\n  }\n}")
tail = tail[:k] + "\n    ++fj_it;" + tail[k:]
open(sys.argv[2], "w").write(head + tail)
