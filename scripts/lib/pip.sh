# Sourced by the scripts that need PyPI packages (scripts/test.sh, scripts/bench/mixes.sh).
#
# pip_ensure PY MODULES PKG...: true when PY imports MODULES ("a, b"), installing PKG... first
# when it does not. A Debian system python refuses a plain `pip install` (PEP 668), so a
# refused install is retried with --break-system-packages.
pip_ensure() {
  local py=$1 modules=$2
  shift 2
  "$py" -c "import $modules" 2>/dev/null \
    || "$py" -m pip install -q "$@" >/dev/null 2>&1 \
    || "$py" -m pip install -q --break-system-packages "$@" >/dev/null 2>&1
}
