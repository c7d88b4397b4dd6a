# shellcheck shell=bash
# Sourced by .ci/run and third_party/sglang_cpu/install.sh:
#   pip_retry TAG PYTHON [pip install arguments...]
# runs `PYTHON -m pip install ARGS`, and retries a failed install from scratch up to three times in
# all, waiting 30 s, then 60 s. A PyPI download that breaks off needs the network to come back:
# when CI once lost pyarrow at 22 of 55 MB, pip's own resume did not get further in six attempts.
pip_retry() {
  local tag="$1" python="$2" attempt
  shift 2
  for attempt in 1 2 3; do
    "$python" -m pip install "$@" && return 0
    [[ $attempt == 3 ]] && break
    echo "$tag pip install failed (attempt $attempt of 3); retrying in $((30 * attempt)) s" >&2
    sleep $((30 * attempt))
  done
  echo "$tag pip install $* failed three times" >&2
  return 1
}
