#!/usr/bin/env bash
# The main job: a local pipetrain cluster (one scheduler, three stage
# workers) trains a job submitted with pipetrainctl, shows its progress and
# final test accuracy, then stops every process it started (also on Ctrl-C).
#
#   deploy/demo.sh [JOB.json] [MIN_ACCURACY]
#
# Ports (override with the environment): scheduler gRPC 7000, REST and
# /metrics 8080, workers gRPC 7101-7103, worker /metrics 9101-9103.
set -euo pipefail

BUILD=${BUILD:-build}
JOB=${1:-examples/fashion_mnist_mlp.job.json}
MIN_ACCURACY=${2:-0.85}
STAGES=${STAGES:-3}
SCHEDULER_PORT=${SCHEDULER_PORT:-7000}
HTTP_PORT=${HTTP_PORT:-8080}
WORKER_PORT=${WORKER_PORT:-7101}
WORKER_METRICS_PORT=${WORKER_METRICS_PORT:-9101}
WORKER_THREADS=${WORKER_THREADS:-1}

bin="$BUILD/services"
for b in pipetrain-scheduler pipetrain-worker; do
  [ -x "$bin/$b" ] || { echo "demo: $bin/$b is missing; run 'make build'" >&2; exit 1; }
done
ctl="$bin/ctl/pipetrainctl"
[ -x "$ctl" ] || { echo "demo: $ctl is missing; run 'make build'" >&2; exit 1; }

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-demo.XXXXXX")
pids=()
cleanup() {
  trap - EXIT INT TERM
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  rm -rf "$run_dir"
}
trap cleanup EXIT
trap 'echo; echo "demo: interrupted, stopping the cluster"; exit 130' INT TERM

wait_for_file() {  # path, what
  for _ in $(seq 1 200); do
    [ -s "$1" ] && return 0
    sleep 0.1
  done
  echo "demo: $2 did not start; its log:" >&2
  cat "$3" >&2 || true
  exit 1
}

echo "== starting the scheduler (gRPC :$SCHEDULER_PORT, REST and /metrics :$HTTP_PORT)"
"$bin/pipetrain-scheduler" --listen "127.0.0.1:$SCHEDULER_PORT" \
  --http_host 127.0.0.1 --http_port "$HTTP_PORT" --data_dir "$run_dir/data" \
  --port_file "$run_dir/scheduler.ports" >"$run_dir/scheduler.log" 2>&1 &
pids+=($!)
wait_for_file "$run_dir/scheduler.ports" "the scheduler" "$run_dir/scheduler.log"

for i in $(seq 0 $((STAGES - 1))); do
  port=$((WORKER_PORT + i))
  metrics=$((WORKER_METRICS_PORT + i))
  echo "== starting worker $i (gRPC :$port, /metrics :$metrics)"
  "$bin/pipetrain-worker" --listen "127.0.0.1:$port" --metrics_host 127.0.0.1 \
    --metrics_port "$metrics" --scheduler "127.0.0.1:$SCHEDULER_PORT" \
    --threads "$WORKER_THREADS" --labels zone=local \
    --port_file "$run_dir/worker$i.ports" >"$run_dir/worker$i.log" 2>&1 &
  pids+=($!)
  wait_for_file "$run_dir/worker$i.ports" "worker $i" "$run_dir/worker$i.log"
done

export PIPETRAIN_SCHEDULER="127.0.0.1:$SCHEDULER_PORT"
for _ in $(seq 1 100); do
  idle=$("$ctl" workers 2>/dev/null | grep -c IDLE || true)
  [ "$idle" -ge "$STAGES" ] && break
  sleep 0.2
done
"$ctl" workers

cat <<INFO

Cluster is up:
  REST API   http://127.0.0.1:$HTTP_PORT/v1/jobs   http://127.0.0.1:$HTTP_PORT/v1/workers
  metrics    http://127.0.0.1:$HTTP_PORT/metrics (scheduler), http://127.0.0.1:$WORKER_METRICS_PORT/metrics (worker 0) ...
  CLI        PIPETRAIN_SCHEDULER=127.0.0.1:$SCHEDULER_PORT $ctl jobs

== submitting $JOB on $STAGES stages
INFO

set +e
"$ctl" submit "$JOB" --stages "$STAGES" --watch --min_accuracy "$MIN_ACCURACY"
status=$?
set -e
job=$("$ctl" jobs | awk 'NR > 1 { id = $1 } END { print id }')
if [ -n "$job" ]; then
  echo
  "$ctl" plan "$job" || true
fi
if [ $status -ne 0 ]; then
  echo "demo: the job did not reach its target (exit $status); logs follow" >&2
  tail -n 20 "$run_dir"/*.log >&2 || true
  exit $status
fi
echo
echo "demo: done; stopping the cluster"
