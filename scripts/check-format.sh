#!/usr/bin/env bash
# Fails when a C/C++ file differs from what clang-format (LLVM 22, .clang-format) makes of it.
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=$(command -v clang-format-22 || echo /usr/lib/llvm-22/bin/clang-format)
files=$(git ls-files '*.h' '*.hpp' '*.cpp' '*.c' | grep -v '^templates/.*\.hip$' || true)
bad=()
for f in $files; do
  "$fmt" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "format check failed; run: $fmt -i ${bad[*]}" >&2
  exit 1
fi
echo "format check: $(echo $files | wc -w) files ok"
