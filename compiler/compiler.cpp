#include "compiler/compiler.h"

namespace flashjit::compiler {

Compiler::~Compiler() = default;

} // namespace flashjit::compiler
