#!/usr/bin/env bash
# The chaos demo: the demo cluster (deploy/demo.sh: one scheduler, three
# stage workers, mutual TLS and tokens) plus a spare worker trains the
# Fashion-MNIST MLP with a checkpoint every 200 steps. Mid-training one
# stage worker is SIGKILLed (the spare takes its place from the last
# checkpoint), and later the scheduler itself is SIGKILLed and started
# again on its data directory. The job's events (worker lost, recovered in
# how many seconds, checkpoints) are shown with pipetrainctl, and the job
# must still reach its test accuracy. Stops every process it started.
#
#   deploy/demo_chaos.sh [JOB.json] [MIN_ACCURACY]
#
# Ports as in demo.sh (scheduler 7000, REST 8080, workers from 7101,
# worker /metrics from 9101); the spare is the last worker.
set -euo pipefail

BUILD=${BUILD:-build}
JOB=${1:-examples/fashion_mnist_mlp.chaos.job.json}
MIN_ACCURACY=${2:-0.85}
STAGES=${STAGES:-3}
SCHEDULER_PORT=${SCHEDULER_PORT:-7000}
HTTP_PORT=${HTTP_PORT:-8080}
WORKER_PORT=${WORKER_PORT:-7101}
WORKER_METRICS_PORT=${WORKER_METRICS_PORT:-9101}
WORKER_THREADS=${WORKER_THREADS:-1}
WORKERS=$((STAGES + 1))

bin="$BUILD/services"
ctl_bin="$bin/ctl/pipetrainctl"
for b in "$bin/pipetrain-scheduler" "$bin/pipetrain-worker" "$ctl_bin"; do
  [ -x "$b" ] || { echo "demo-chaos: $b is missing; run 'make build'" >&2; exit 1; }
done

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-chaos.XXXXXX")
pki="$run_dir/pki"
pids=()        # every process started, for the cleanup
worker_pids=() # by worker index
scheduler_pid=
cleanup() {
  trap - EXIT INT TERM
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  rm -rf "$run_dir"
}
trap cleanup EXIT
trap 'echo; echo "demo-chaos: interrupted, stopping the cluster"; exit 130' INT TERM

say() { echo; echo "== $(date +%T) $*"; }

wait_for_file() {  # path, what, log
  for _ in $(seq 1 200); do
    [ -s "$1" ] && return 0
    sleep 0.1
  done
  echo "demo-chaos: $2 did not start; its log:" >&2
  cat "$3" >&2 || true
  exit 1
}

tls() {  # name: the mutual-TLS flags of one process
  echo --tls_cert "$pki/$1.crt" --tls_key "$pki/$1.key" --tls_ca "$pki/ca.crt"
}

start_scheduler() {  # the same data directory every time
  rm -f "$run_dir/scheduler.ports"
  # shellcheck disable=SC2046  # tls prints separate flags
  "$bin/pipetrain-scheduler" --listen "127.0.0.1:$SCHEDULER_PORT" $(tls pipetrain-scheduler) \
    --auth_tokens_file "$pki/tokens" --join_token_file "$pki/join.token" \
    --http_host 127.0.0.1 --http_port "$HTTP_PORT" --data_dir "$run_dir/data" \
    --port_file "$run_dir/scheduler.ports" >>"$run_dir/scheduler.log" 2>&1 &
  scheduler_pid=$!
  pids+=("$scheduler_pid")
  wait_for_file "$run_dir/scheduler.ports" "the scheduler" "$run_dir/scheduler.log"
}

start_worker() {  # index
  local i=$1 port=$((WORKER_PORT + $1)) metrics=$((WORKER_METRICS_PORT + $1))
  # shellcheck disable=SC2046
  "$bin/pipetrain-worker" --listen "127.0.0.1:$port" --metrics_host 127.0.0.1 \
    $(tls "pipetrain-worker-$i") --join_token_file "$pki/join.token" \
    --metrics_port "$metrics" --scheduler "127.0.0.1:$SCHEDULER_PORT" \
    --threads "$WORKER_THREADS" --labels zone=local \
    --port_file "$run_dir/worker$i.ports" >"$run_dir/worker$i.log" 2>&1 &
  worker_pids[i]=$!
  pids+=("$!")
  wait_for_file "$run_dir/worker$i.ports" "worker $i" "$run_dir/worker$i.log"
}

say "making a throwaway CA, certificates and tokens in $pki"
bash "$(dirname "$0")/pki.sh" "$pki" "$WORKERS"

export PIPETRAIN_SCHEDULER="127.0.0.1:$SCHEDULER_PORT"
PIPETRAIN_TOKEN=$(cat "$pki/operator.token")
export PIPETRAIN_TOKEN
ctl_tls=$(tls pipetrain-client)
ctl() {
  # shellcheck disable=SC2086
  "$ctl_bin" $ctl_tls "$@"
}

# Polls `ctl ARGS` until its output matches REGEX (up to SECONDS).
wait_until() {  # seconds regex ctl-args...
  local seconds=$1 regex=$2
  shift 2
  for _ in $(seq 1 $((seconds * 5))); do
    ctl "$@" 2>/dev/null | grep -Eq "$regex" && return 0
    sleep 0.2
  done
  echo "demo-chaos: timed out waiting for /$regex/ in 'pipetrainctl $*'" >&2
  tail -n 20 "$run_dir"/*.log >&2 || true
  exit 1
}

say "starting the scheduler (gRPC :$SCHEDULER_PORT, REST :$HTTP_PORT, data in $run_dir/data)"
start_scheduler
for i in $(seq 0 $((WORKERS - 1))); do
  say "starting worker $i (gRPC :$((WORKER_PORT + i)))$([ "$i" -eq "$STAGES" ] && echo ', the spare')"
  start_worker "$i"
done
for _ in $(seq 1 100); do
  [ "$(ctl workers 2>/dev/null | grep -c IDLE || true)" -ge "$WORKERS" ] && break
  sleep 0.2
done
ctl workers

say "submitting $JOB on $STAGES stages (one worker stays spare)"
ctl submit "$JOB" --stages "$STAGES"
job=$(ctl jobs | awk 'NR > 1 { id = $1 } END { print id }')
[ -n "$job" ] || { echo "demo-chaos: no job was submitted" >&2; exit 1; }

say "waiting for the first committed checkpoint of $job"
wait_until 300 '^ *[0-9]+ ' checkpoints "$job"
ctl checkpoints "$job"

# The worker of stage 1 (the STAGE table of `get`), and its process by the
# gRPC port `workers` lists for it.
victim_id=$(ctl get "$job" | awk '$1 == "1" && $2 ~ /^w-/ { print $2; exit }')
port=$(ctl workers | awk -v id="$victim_id" '$1 == id { print $2 }' | sed 's/.*://')
victim=$((${port:-0} - WORKER_PORT))
if [ -z "$victim_id" ] || [ "$victim" -lt 0 ] || [ "$victim" -ge "$WORKERS" ]; then
  echo "demo-chaos: could not tell which worker runs stage 1" >&2
  ctl get "$job" >&2 || true
  exit 1
fi
say "SIGKILL worker $victim ($victim_id, stage 1 of $job)"
kill -9 "${worker_pids[victim]}"
wait "${worker_pids[victim]}" 2>/dev/null || true  # (no "Killed" notice)
wait_until 120 ' recovered +[0-9]' get "$job"
ctl get "$job"

say "SIGKILL the scheduler; the stages train on without it"
kill -9 "$scheduler_pid"
wait "$scheduler_pid" 2>/dev/null || true
sleep 3
say "starting the scheduler again on the same data directory"
start_scheduler
# It reloads jobs, workers, plans and the checkpoint catalog from its data
# directory and follows the running job through its workers' heartbeats
# (the stages trained on while it was away). Until they arrive, `get` shows
# the progress stored before the kill.
sleep 2
ctl get "$job" || true

say "watching $job to its end (it must reach a test accuracy of $MIN_ACCURACY)"
set +e
ctl watch "$job" --min_accuracy "$MIN_ACCURACY"
status=$?
set -e
say "the job as the scheduler saw it"
ctl get "$job" || true
if [ $status -ne 0 ]; then
  echo "demo-chaos: the job did not reach its target (exit $status); logs follow" >&2
  tail -n 30 "$run_dir"/*.log >&2 || true
  exit $status
fi
echo
echo "demo-chaos: done; stopping the cluster"
