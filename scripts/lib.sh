# Sourced by the scripts: installs what a fresh Debian machine lacks.

# need_debs CHECK=PACKAGE ...: installs PACKAGE (from Debian's archive) for
# each CHECK that fails. CHECK is a command name, or an absolute path that
# must exist.
need_debs() {
  local missing=() pair check
  for pair in "$@"; do
    check=${pair%%=*}
    if [[ $check == /* ]]; then [[ -e $check ]] && continue
    else command -v "$check" >/dev/null && continue
    fi
    missing+=("${pair#*=}")
  done
  ((${#missing[@]})) || return 0
  printf '==> installing %s\n' "${missing[*]}" >&2
  command -v apt-get >/dev/null || { echo "need ${missing[*]}, and there is no apt-get to install them" >&2; return 1; }
  local sudo=()
  ((EUID == 0)) || sudo=(sudo)
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { echo "cannot install ${missing[*]}" >&2; return 1; }
}

# The Rust build's own needs: protoc, for the etcd client's gRPC code.
need_build_tools() {
  command -v cargo >/dev/null || { echo "cargo not found; install Rust (rustup)" >&2; return 1; }
  need_debs protoc=protobuf-compiler
}

# The Python face's needs: python3 with venv and pip (Debian splits them).
need_python() {
  need_debs python3=python3 || return 1
  python3 -c 'import ensurepip, venv' 2>/dev/null || need_debs /usr/share/doc/python3-venv=python3-venv
}
