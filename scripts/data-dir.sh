#!/usr/bin/env bash
# Print the folder that holds the shared data: $KVCAL_DATA, then data/cache/, then ../shared/data.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for d in "${KVCAL_DATA:-}" "$here/data/cache" "$here/../shared/data"; do
  if [ -n "$d" ] && [ -f "$d/stories260K/stories260K.bin" ]; then
    (cd "$d" && pwd)
    exit 0
  fi
done
echo "data-dir: no data found in \$KVCAL_DATA, data/cache/ or ../shared/data (see data/README.md)" >&2
exit 1
