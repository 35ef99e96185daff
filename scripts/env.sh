# Sourced by the scripts: toolchain on PATH and a build cache outside the clone, keyed by
# the compiler version, so a rerun is fast and a fresh machine still works.
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if [ -z "${CARGO_TARGET_DIR:-}" ] && [ "$(id -u)" -eq 0 ]; then
  rustv=$(rustc --version 2>/dev/null | awk '{print $2}')
  export CARGO_TARGET_DIR="/var/cache/ironlet-ci/target-${rustv:-unknown}"
  mkdir -p "$CARGO_TARGET_DIR"
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$(pwd)/target}"
