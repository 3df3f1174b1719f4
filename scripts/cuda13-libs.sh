# shellcheck shell=bash
# Sourced by scripts/gpu-check.sh and the env.sh of scripts/gpu-bundle.sh's bundle.
# cuda13_python_dirs prints, one per line, the folders of Python's nvidia packages that hold CUDA
# 13's libcublas and libcudart (where a PyTorch image keeps its CUDA runtime); nothing without them.
cuda13_python_dirs() {
  local site
  site=$(env -u LD_LIBRARY_PATH python3 -c \
    'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null) || return 0
  [ -n "$site" ] || return 0
  find "$site/nvidia" \( -name 'libcublas.so.13' -o -name 'libcudart.so.13' \) -printf '%h\n' \
    2>/dev/null | sort -u
}
