#!/usr/bin/env bash
# The one device script (issues 42 item 4 and 43 item 1): everything a session lent a GPU measures, in one call of at
# most 8 minutes, every result under one folder.
#
#   bench/gpu.sh [OUT_DIR]               on the GPU machine (default OUT_DIR: $OUT/gpu, else bench/results/gpu_DATE)
#   bench/gpu.sh --cpu-smoke OUT_DIR     the same steps at tiny widths on this CPU (tests/test_bench.py runs it)
#
# Steps, each under its own time limit (so one slow step cannot take the others' minutes; the total stays < 8 min),
# each writing as it goes (a step cut short keeps what it finished: *.partial.json):
#   1. devices.txt, nvidia-smi.txt: what ran it;
#   2. train/: the MFU probe, bench/train.py: Mega-width BART train step, batch 16 and 32, full remat, bfloat16 compute;
#   3. generate/: bench/generate.py --device gpu: Mega width, 1, 9, 16 and 64 images, ours (bfloat16) beside
#      min-dalle (float16), and the second-process time (two `dalle-nb generate` sharing a compilation cache);
#   4. decode_xla/, pool16/ (as far as the budget goes): ours at 9 and 64 images with XLA's attention in 8 stages
#      (`--decode xla`), and with JAX's memory pool capped at 16 GB (`--gpu-pool-gb 16`).
# steps.txt lists each step's exit status (124: its time limit); gpu.log, what ran when.
# How to run it with the device tool (its command, carry and PYTHONPATH): BENCHMARKS.md, "The device script".
set -uo pipefail
cd "$(dirname "$0")/.."
smoke=0
if [ "${1:-}" = "--cpu-smoke" ]; then smoke=1; shift; fi
out=${1:-${OUT:+$OUT/gpu}}
out=${out:-bench/results/gpu_$(date -u +%Y%m%d)}
mkdir -p "$out/bin"
start=$(date +%s)
budget=${GPU_SH_BUDGET:-470}                                  # seconds for all steps: 8 minutes less the start-up
(( smoke )) && budget=${GPU_SH_BUDGET:-3000}                  # a shared CPU: no device minutes to save, limits x6

log() { echo "[gpu.sh +$(( $(date +%s) - start ))s] $*" | tee -a "$out/gpu.log"; }
# step NAME LIMIT_S COMMAND...: run COMMAND for at most LIMIT_S seconds, and never past the budget
step() {
  local name=$1 limit=$2; shift 2
  (( smoke )) && limit=$(( limit * 6 ))
  local left=$(( budget - ($(date +%s) - start) ))
  (( left < limit )) && limit=$left
  if (( limit < 10 )); then
    log "$name: skipped, the budget is spent"; echo "$name skipped" >> "$out/steps.txt"; return
  fi
  log "$name (at most ${limit}s): $*"
  timeout --signal=INT --kill-after=15 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc"; echo "$name $rc" >> "$out/steps.txt"
}

# `dalle-nb` for the second-process timing, where the package is on PYTHONPATH rather than installed
cat > "$out/bin/dalle-nb" <<EOF
#!/usr/bin/env bash
exec "$(command -v python)" -c "import sys; from dalle_nb.cli import main; sys.exit(main(sys.argv[1:]))" "\$@"
EOF
chmod +x "$out/bin/dalle-nb"
command -v dalle-nb >/dev/null 2>&1 || export PATH="$PWD/$out/bin:$PATH"
: > "$out/steps.txt"

if (( smoke )); then
  export JAX_PLATFORMS=cpu
  device=cpu; train=(--smoke); gen=(--smoke --second-process --sides ours); alt=(--smoke --sides ours)
else
  device=gpu
  train=(--preset mega --batch 16,32 --remat full --dtype bfloat16 --steps 8 --warmup 2 --timeout 90)
  gen=(--widths mega --images 1,9,16,64 --repeats 2 --quantize bfloat16 --second-process)
  alt=(--widths mega --images 9,64 --repeats 1 --quantize bfloat16 --sides ours)
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1
fi
python -c "import jax, platform; print(platform.node(), 'jax', jax.__version__, jax.devices())" \
  > "$out/devices.txt" 2>&1
log "devices: $(tail -1 "$out/devices.txt")"

step train 185 python bench/train.py "${train[@]}" --out "$out/train"
models=${TMPDIR:-/tmp}/gpu_sh_models                    # random weights (gigabytes): kept out of the results folder
step generate 400 python bench/generate.py --device "$device" "${gen[@]}" --cache "$models" --out "$out/generate"
# if minutes are left: the same Mega model with XLA's attention in 8 stages instead of the kernel, and with JAX's memory
# pool capped at 16 GB (the autotuner's scratch bounded; issue 42 item 3's budget at 9 images)
step decode_xla 90 python bench/generate.py --device "$device" "${alt[@]}" --decode xla --cache "$models" --out "$out/decode_xla"
step pool16 90 python bench/generate.py --device "$device" "${alt[@]}" --gpu-pool-gb 16 --cache "$models" --out "$out/pool16"
rm -rf "$out/bin"
log "done: $(tr '\n' ' ' < "$out/steps.txt")"
