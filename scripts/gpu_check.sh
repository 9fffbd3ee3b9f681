#!/usr/bin/env bash
# The GPU checks, run on a CUDA machine from the repository root; logs go to $OUT (default
# ./gpu-out). Optional: .gpu/ holding the sdists of mamba-ssm and causal-conv1d (from PyPI), which
# are then built for sm_90 only and installed (on 16 cores mamba-ssm took about 6 minutes;
# causal-conv1d did not finish in 400 s with 4 jobs), and .whl/ holding wheels of Python packages
# the machine lacks (tcl.features needs orjson), installed to /tmp/site first.
#   1. tests/test_mamba.py on CUDA through the PyTorch scans (no mamba-ssm), during the build,
#   2. training throughput on the GPU next to the CPU, same run (`tcl bench train --device`),
#   3. with the kernels built: the same tests (now also the comparison with mamba-ssm's own block)
#      and the training throughput through selective_scan_fn / causal_conv1d_fn (--scan cuda).
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
BUILD_S=${BUILD_S:-420}
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"

build() {  # build SDIST ENV_PREFIX JOBS: pip-install an sdist for sm_90 only
    local src=$1 flag=$2 jobs=$3
    tar xzf ".gpu/$src.tar.gz" -C /tmp || return 1
    # keep sm_90 alone among the setup's -gencode targets (nine architectures take nine times as long)
    python3 - "/tmp/$src/setup.py" <<'PY'
import re, sys
p = sys.argv[1]; s = open(p).read()
pair = re.compile(r'cc_flag\.append\("-gencode"\)\n(\s*)cc_flag\.append\("arch=compute_(\d+),code=sm_\d+"\)')
s = pair.sub(lambda m: m.group(0) if m.group(2) == "90" else "pass", s)
open(p, "w").write(s)
PY
    (cd "/tmp/$src" && env "${flag}_FORCE_BUILD=TRUE" MAX_JOBS="$jobs" timeout "$BUILD_S" \
        python3 -m pip install -q --no-build-isolation --no-deps --no-index .)
}
if [ -d .gpu ]; then
    ( build causal_conv1d-1.7.0 CAUSAL_CONV1D 8 > "$OUT/build-causal-conv1d.log" 2>&1
      echo "exit $?" >> "$OUT/build-causal-conv1d.log" ) &
    ( build mamba_ssm-2.3.2.post1 MAMBA 10 > "$OUT/build-mamba-ssm.log" 2>&1
      echo "exit $?" >> "$OUT/build-mamba-ssm.log" ) &
fi

# the tests need no quiet machine: they run while the kernels compile
python3 -m pytest -q -p no:cacheprovider tests/test_mamba.py -rs 2>&1 | tee "$OUT/tests-torch-scans.log"
wait
tail -n 3 "$OUT"/build-*.log 2>/dev/null
# throughput after the build, on idle cores: GPU (PyTorch scans), then the CPU baseline
bench() { python3 -m tcl.cli bench train --samples "$1" "${@:2}" 2>&1; }
bench 16384 --models mamba-kb,mamba-ac,mlp,tlp --device cuda --scan fast | tee "$OUT/bench-train-cuda.log"
bench 4096 --models mamba-kb,mamba-ac,mlp,tlp --device cpu | tee "$OUT/bench-train-cpu.log"
if python3 -c "import mamba_ssm.ops.selective_scan_interface" 2>/dev/null; then  # causal-conv1d optional
    python3 -m pytest -q -p no:cacheprovider tests/test_mamba.py -rs 2>&1 | tee "$OUT/tests-kernels.log"
    bench 16384 --models mamba-kb,mamba-ac --device cuda --scan cuda | tee "$OUT/bench-train-cuda-kernels.log"
else
    python3 -c "import mamba_ssm.ops.selective_scan_interface" 2>&1 | tail -n 3
fi
