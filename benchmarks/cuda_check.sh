#!/usr/bin/env bash
# The GPU checks, in one run on a machine with CUDA (the device tool's, or any): the CUDA tests, then the
# paper-size throughput (full and sampled softmax) and training by catalogue size. Results go to $OUT
# (default reports/benchmarks/), each written as soon as it is measured.
#   OUT=/tmp/cuda bash benchmarks/cuda_check.sh
# Without the project installed, it runs from the source tree; wheels in .whl/ (pydantic and its needs, for
# an image that lacks them) are installed to /tmp/site first.
set -u
OUT=${OUT:-reports/benchmarks}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
PY=${PY:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/cuda_machine.txt"
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/cuda_machine.txt"
note="$(head -2 "$OUT/cuda_machine.txt" | tail -1), $(nproc) CPU cores"
timeout 200 $PY benchmarks/train_throughput.py --device cuda --softmax full sampled --steps 50 --warmup 5 \
  --reference-steps 20 --note "$note" --out "$OUT/throughput_cuda.json" 2>&1 | tee "$OUT/throughput_cuda.log"
timeout 120 $PY -m pytest tests/training/test_cuda.py -q -p no:cacheprovider --noconftest 2>&1 | tee "$OUT/test_cuda.log"
timeout 200 $PY benchmarks/train_throughput_catalogue.py --device cuda --steps 20 --warmup 3 --note "$note" \
  --configs global_state_update:30000:full global_state_update:30000:sampled global_state_update:30000:encoder_only \
  global_state_attrs:3000:full global_state_attrs:3000:sampled global_state_attrs:105000:full \
  global_state_attrs:105000:sampled none:105000:full none:105000:sampled \
  --out "$OUT/throughput_catalogue_cuda.json" 2>&1 | tee "$OUT/throughput_catalogue_cuda.log"
