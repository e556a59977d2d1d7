# Shared by the scripts: install what building Weir needs, once.

# Installs the Debian packages named that are not installed yet.
ensure_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing ${missing[*]} (apt-get)" >&2
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# One target directory outside the clone, so that every clone (and CI)
# reuses the same build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/weir-target}"

# Installs a program from crates.io with `cargo install` unless it is on
# the PATH or in cargo's bin directory already: ensure_crate BIN CRATE
# VERSION [cargo install flags…].
ensure_crate() {
    local bin="$1" crate="$2" version="$3"
    shift 3
    command -v "$bin" >/dev/null 2>&1 && return 0
    [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/$bin" ] && return 0
    echo "installing $crate $version (cargo install)" >&2
    CARGO_TARGET_DIR="$CARGO_TARGET_DIR/tools" \
        cargo install --quiet --locked "$crate" --version "$version" "$@"
}

# Python packages from PyPI in a virtualenv of their own beside the build:
# ensure_venv DIR MODULE PACKAGE… (skipped when DIR's python imports MODULE).
ensure_venv() {
    local dir="$1" module="$2"
    shift 2
    [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import $module" 2>/dev/null && return 0
    echo "installing $* (pip, in $dir)" >&2
    python3 -m venv "$dir"
    "$dir/bin/pip" install --quiet "$@"
}
