// The IR interpreter: executes a Program on the CPU with the IR's own semantics.
// Tiles are float arrays; every `convert` rounds to its dtype exactly, and stores
// round to the tensor's dtype.
#pragma once

#include "ir/ir.h"
#include "ir/reference.h"

namespace flashjit::ir {

/// Runs every workgroup of `p`, with its scalar parameters bound by `args`, over
/// the buffers (named Q, K, V, O and LSE when the program has it). Buffer sizes
/// are checked against the tensors' shapes and strides first.
Status interpret(const Program &p, const Bindings &args, HostTensors &t);

} // namespace flashjit::ir
