#!/usr/bin/env bash
# Checks the C++ sources against .clang-format (check mode: nothing is rewritten; `make format`
# rewrites). With no argument every tracked .cpp/.h is checked (the tree is kept formatted, so
# this is what CI runs); with `--changed [BASE]` only the files that differ from BASE (default
# HEAD: the work tree's uncommitted changes), for a quick check before a commit.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check_format: clang-format is not installed (scripts/setup.sh installs it)" >&2; exit 2; }
if [ "${1:-}" = "--changed" ]; then
  mapfile -t files < <(git diff --name-only --diff-filter=d "${2:-HEAD}" -- '*.cpp' '*.h')
else
  mapfile -t files < <(git ls-files '*.cpp' '*.h')
fi
if [ "${#files[@]}" -eq 0 ]; then
  echo "check_format: no C++ file to check"
  exit 0
fi
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/check_format.$$; then
  grep -E '^[^ ].*: (error|warning):' /tmp/check_format.$$ | cut -d: -f1 | sort -u | sed 's/^/not formatted: /' >&2
  rm -f /tmp/check_format.$$
  echo "check_format: run 'make format' (clang-format $(clang-format --version | grep -oE '[0-9]+\.[0-9.]+' | head -1))" >&2
  exit 1
fi
rm -f /tmp/check_format.$$
echo "check_format: ${#files[@]} files formatted"
