# Session 37: the RDNA backward's VGPRs and spills by head dim and modifier, on one tree.
# F=path/to/flashjit bash bench/results/rdna_backward_spills_2026-11-29_session37.sh
F=${F:-build/tools/flashjit}
for arch in gfx1201 gfx1100; do
for kernel in backward-dkdv backward-dq; do
for feat in "" "--causal" "--causal --window 64,0" "--dropout 0.1" "--attn-mask bool:bk" "--attn-mask f32:qk" "--attn-mask bf16:qk" "--softcap 20" "--alibi heads" "--dropout 0.1 --attn-mask bool:bk --softcap 20"; do
for d in 32 64 80 96 128 160 192 224 256; do
  r=$($F compile --arch $arch --heads 8 --seqlen-q 512 --head-dim $d $feat --kernel $kernel --resources 2>&1 | tail -2 | tr '\n' ' ')
  cfg=$(echo "$r" | sed -n 's/.*config: \([^(]*\)(.*/\1/p' | sed 's/stages=1 //; s/pad_k=16 //; s/mma_m=16 //')
  res=$(echo "$r" | sed -n 's/.*wave32, \([0-9]* VGPRs\).*spills \([0-9]* VGPR\).*/\1 spills \2/p')
  echo "$arch $kernel $d [$feat]: $cfg $res"
done; done; done; done
