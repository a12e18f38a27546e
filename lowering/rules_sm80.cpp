// The sm80 rule set (lowering/rules_sm80.h).
#include "lowering/rules_sm80.h"

namespace flashjit::lowering {

const Rules &sm80_rules() {
  static const Sm80Rules rules;
  return rules;
}

} // namespace flashjit::lowering
