// The IR interpreter: executes a Program on the CPU with the IR's own semantics.
// Tiles are float arrays; every `convert` rounds to its dtype exactly, and stores
// round to the tensor's dtype.
#pragma once

#include "ir/ir.h"
#include "ir/reference.h"

#include <map>
#include <string>
#include <vector>

namespace flashjit::ir {

/// Runs every workgroup of `p`, with its scalar parameters bound by `args`, over
/// the buffers (named Q, K, V, O and LSE when the program has it). Buffer sizes
/// are checked against the tensors' shapes and strides first.
Status interpret(const Program &p, const Bindings &args, HostTensors &t);

/// The same with more buffers: HostTensors' dout and dq are the tensors dO and
/// dQ; `workspace` names the others (the backward's L, D, dK, dV).
Status interpret(const Program &p, const Bindings &args, HostTensors &t,
                 const std::map<std::string, std::vector<float> *> &workspace);

/// The backward's preprocess on the host, the definition the preprocess kernel
/// follows: for each query row, D = rowsum(dO * O) in f32 and L = LSE * log2(e),
/// +inf where LSE is -inf (a row that sees no key, whose P must be 0). t.o and
/// t.lse are the forward's outputs; l and d get batch * heads * seqlen_q floats
/// each (dense [batch, heads, seqlen_q]).
void backward_preprocess(const AttentionSpec &spec, const HostTensors &t, std::vector<float> &l,
                         std::vector<float> &d);

} // namespace flashjit::ir
