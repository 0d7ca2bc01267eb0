#!/usr/bin/env bash
# The benchmarks an accelerator changes, in one call of bounded length, on a machine with a GPU
# (many CPU cores, one GPU; JAX with CUDA installed):
#
#     bash experiments/gpu_benchmarks.sh OUTDIR [SECONDS]
#
# 1. online FA's streaming throughput at D = 10^6 with the device's measured bandwidth and the
#    host-to-device bound (alone on the GPU);
# 2. then, side by side: the scaling table at the real sizes (eight cells at a time, each killed
#    after 300 s and reported as timed out), the tensor analyzer's, the rank SVM's and
#    convolutional FA's quick benchmarks.
# Everything is written under OUTDIR (JSON per benchmark, logs in logs.tar.gz); SECONDS (default
# 480) bounds the whole script. Cells run in parallel share the GPU: their per-sweep seconds are
# upper bounds (docs/scaling.md says so beside the table).
set -u
out=${1:?usage: bash experiments/gpu_benchmarks.sh OUTDIR [SECONDS]}
budget=${2:-480}
py=${PYTHON:-python3}
mkdir -p "$out/logs"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several processes share the GPU's memory
export PYTHONUNBUFFERED=1
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }

{ nvidia-smi -L; nproc; "$py" -c "import jax, numpyro, arviz; print('jax', jax.__version__, \
'numpyro', numpyro.__version__, 'arviz', arviz.__version__, jax.devices())"; } \
  > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

timeout 150 "$py" experiments/bench_online_fa.py --no-accuracy --json "$out/bench_online_fa.json" \
  > "$out/logs/online_fa.log" 2>&1
echo "online FA: exit $? after $((SECONDS - start)) s"

t=$(( $(left) - 15 ))
if [ "$t" -lt 30 ]; then echo "no time left for the rest ($t s)"; t=30; fi
timeout "$t" "$py" experiments/bench_scaling.py --jobs 8 --sweeps 20 --timeout 300 \
  --min-elements 50000 --json "$out/bench_scaling.json" > "$out/logs/scaling.log" 2>&1 &
for b in bench_tensor_analyzer bench_rank_svm bench_conv_factor; do
  timeout "$t" "$py" "experiments/$b.py" --quick --json "$out/$b.json" > "$out/logs/$b.log" 2>&1 &
done
wait
echo "all done after $((SECONDS - start)) s"
tail -n 3 "$out"/logs/bench_*.log
cat "$out/logs/scaling.log"
tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -r "$out/logs"
