F=${F:-build/tools/flashjit}
for arch in gfx1201 gfx1100; do
for feat in "" "--causal" "--dropout 0.1" "--causal --dropout 0.1" "--attn-mask bool:bk" "--attn-mask f32:qk" "--softcap 20" "--mask-mod kv_idx<=q_idx" "--alibi heads"; do
for d in 64 80 96 128 160 192 256; do
  r=$($F compile --arch $arch --heads 8 --seqlen-q 512 --head-dim $d $feat --resources 2>&1 | tail -2 | tr '\n' ' ')
  cfg=$(echo "$r" | sed -n 's/.*config: \([^(]*\)(.*/\1/p')
  res=$(echo "$r" | sed -n 's/.*wave32, \([0-9]* VGPRs\).*spills \([0-9]* VGPR\).*/\1 spills \2/p')
  echo "$arch fwd $d [$feat]: $cfg $res"
done; done; done
