#!/usr/bin/env bash
# Keep the shipped draft head (19.7 MB, tracked) out of one device call's copy of the working tree.
# The device tool carries tracked files plus the `carry` paths, at most 64 MiB in all. The
# default model's GGUF travels in two calls (.models/p1, 60 MB; .models/p2, 38 MB), and p1 only
# fits without the head. So:
#   bash scripts/device_carry.sh hide      # before the first call (carry .whl .models/p1)
#   bash scripts/device_carry.sh restore   # right after it, before the next call (.models/p2 ...)
# `hide` untracks the head in the index only (no commit; the files stay on disk) and ignores it
# locally; `restore` undoes both. `git status` shows the head as deleted while hidden.
set -euo pipefail
cd "$(dirname "$0")/.."
HEAD_DIR=hotspec/assets/smollm2-eagle3
EXCLUDE=.git/info/exclude
case "${1:-}" in
  hide)
    git rm -r -q --cached "$HEAD_DIR"
    grep -qxF "$HEAD_DIR/" "$EXCLUDE" 2>/dev/null || echo "$HEAD_DIR/" >> "$EXCLUDE"
    echo "hidden: $HEAD_DIR (run 'bash scripts/device_carry.sh restore' after the call)";;
  restore)
    sed -i "\#^$HEAD_DIR/\$#d" "$EXCLUDE"
    git reset -q -- "$HEAD_DIR"
    git diff --quiet -- "$HEAD_DIR" && echo "restored: $HEAD_DIR";;
  *) echo "usage: bash scripts/device_carry.sh hide|restore" >&2; exit 2;;
esac
