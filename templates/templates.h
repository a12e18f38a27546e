// The embedded templates/*.hip files (see cmake/embed.cmake).
#pragma once

#include <string_view>
#include <utility>
#include <vector>

namespace flashjit::templates {

extern const std::string_view amdgcn_prelude;
extern const std::string_view attention_common;
/// The block-range pass's interval arithmetic (fj_iv_*), in kernels whose loops
/// narrow their block range by a mask expression; ir/interval.h runs it on the host.
extern const std::string_view block_range;
extern const std::string_view cuda_prelude;
/// The CPU emulator's prelude: the fj_* wrappers over runtime/emulator.cpp's hooks.
extern const std::string_view emulator_prelude;
/// A mask tensor's block summary: its classes and fj_mask_cell, in the summary
/// kernel (lowering/mask_blocks.cpp) and the attention kernels that read it.
extern const std::string_view mask_blocks;
/// The simt rules' FMA product (fj_simt_mma), part of their kernels' text.
extern const std::string_view simt_fma;
/// The sm90 rules' warpgroup-product helpers (wgmma, descriptors, swizzle), after
/// the CUDA prelude.
extern const std::string_view sm90_wgmma;
/// SHA-256 over every embedded template: part of the kernel cache key.
extern const std::string_view bundle_hash;
const std::vector<std::pair<std::string_view, std::string_view>> &all();

} // namespace flashjit::templates
