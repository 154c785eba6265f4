# Shared by scripts/quickstart and scripts/test (sourced, not run): system packages and .venv.
# shellcheck shell=bash

apt_install() {
  # Install the Debian packages named, if any is missing. Needs root (or says how).
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "error: missing system packages: ${missing[*]} (install them, e.g. sudo apt-get install ${missing[*]})" >&2
    return 1
  fi
  echo "Installing ${missing[*]} ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null
  }
}

make_venv() {
  # .venv with this project installed. With extras (e.g. "dev") it is an editable install for
  # working on the code; without, a plain install as a user gets (no import hook on every
  # start of clusterctl: an editable install adds ~9 ms to each).
  local extras=${1:-}
  local python=${PYTHON:-python3}
  if [ ! -x .venv/bin/python ]; then
    if ! "$python" -m venv .venv 2>/dev/null; then
      rm -rf .venv
      apt_install python3-venv
      "$python" -m venv .venv
    fi
  fi
  .venv/bin/python -m pip install -q --upgrade pip
  if [ -n "$extras" ]; then
    .venv/bin/python -m pip install -q -e ".[$extras]"
  else
    .venv/bin/python -m pip install -q .
  fi
}
