#!/usr/bin/env bash
# The main job: a local pipetrain cluster (one scheduler, three stage
# workers) trains a job submitted with pipetrainctl, shows its progress and
# final test accuracy, then stops every process it started (also on Ctrl-C).
#
#   deploy/demo.sh [JOB.json] [MIN_ACCURACY]
#
# Ports (override with the environment): scheduler gRPC 7000, REST and
# /metrics 8080, workers gRPC 7101-7103, worker /metrics 9101-9103.
#
# Secured like a real cluster: deploy/pki.sh makes a throwaway CA,
# certificates, bearer tokens and a join token in the run directory; every
# gRPC connection is mutual TLS, REST and /metrics are HTTPS, and the control
# API wants a token.
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
pki="$run_dir/pki"
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

echo "== making a throwaway CA, certificates and tokens in $pki"
bash "$(dirname "$0")/pki.sh" "$pki" "$STAGES"
tls() {  # name: the mutual-TLS flags of one process
  echo --tls_cert "$pki/$1.crt" --tls_key "$pki/$1.key" --tls_ca "$pki/ca.crt"
}

echo "== starting the scheduler (gRPC :$SCHEDULER_PORT, REST and /metrics :$HTTP_PORT)"
# shellcheck disable=SC2046  # tls prints separate flags
"$bin/pipetrain-scheduler" --listen "127.0.0.1:$SCHEDULER_PORT" $(tls pipetrain-scheduler) \
  --auth_tokens_file "$pki/tokens" --join_token_file "$pki/join.token" \
  --http_host 127.0.0.1 --http_port "$HTTP_PORT" --data_dir "$run_dir/data" \
  --port_file "$run_dir/scheduler.ports" >"$run_dir/scheduler.log" 2>&1 &
pids+=($!)
wait_for_file "$run_dir/scheduler.ports" "the scheduler" "$run_dir/scheduler.log"

for i in $(seq 0 $((STAGES - 1))); do
  port=$((WORKER_PORT + i))
  metrics=$((WORKER_METRICS_PORT + i))
  echo "== starting worker $i (gRPC :$port, /metrics :$metrics)"
  # shellcheck disable=SC2046
  "$bin/pipetrain-worker" --listen "127.0.0.1:$port" --metrics_host 127.0.0.1 \
    $(tls "pipetrain-worker-$i") --join_token_file "$pki/join.token" \
    --metrics_port "$metrics" --scheduler "127.0.0.1:$SCHEDULER_PORT" \
    --threads "$WORKER_THREADS" --labels zone=local \
    --port_file "$run_dir/worker$i.ports" >"$run_dir/worker$i.log" 2>&1 &
  pids+=($!)
  wait_for_file "$run_dir/worker$i.ports" "worker $i" "$run_dir/worker$i.log"
done

export PIPETRAIN_SCHEDULER="127.0.0.1:$SCHEDULER_PORT"
PIPETRAIN_TOKEN=$(cat "$pki/operator.token")
export PIPETRAIN_TOKEN
ctl_tls=$(tls pipetrain-client)
ctl() {
  # shellcheck disable=SC2086
  "$ctl" $ctl_tls "$@"
}
for _ in $(seq 1 100); do
  idle=$(ctl workers 2>/dev/null | grep -c IDLE || true)
  [ "$idle" -ge "$STAGES" ] && break
  sleep 0.2
done
ctl workers
# The REST and metrics ports answer over HTTPS, checked against the CA.
curl -fsS --cacert "$pki/ca.crt" -o /dev/null "https://127.0.0.1:$HTTP_PORT/readyz" ||
  { echo "demo: the scheduler's HTTPS port does not answer" >&2; exit 1; }

cat <<INFO

Cluster is up (mutual TLS between all processes; tokens on the control API):
  REST API   curl --cacert $pki/ca.crt -H "Authorization: Bearer \$(cat $pki/viewer.token)" https://127.0.0.1:$HTTP_PORT/v1/jobs
  metrics    the same on https://127.0.0.1:$HTTP_PORT/metrics (scheduler);
             curl --cacert $pki/ca.crt https://127.0.0.1:$WORKER_METRICS_PORT/metrics (worker 0) ...
  CLI        PIPETRAIN_SCHEDULER=127.0.0.1:$SCHEDULER_PORT PIPETRAIN_TOKEN=\$(cat $pki/operator.token) \\
               $ctl $ctl_tls jobs

== submitting $JOB on $STAGES stages
INFO

set +e
ctl submit "$JOB" --stages "$STAGES" --watch --min_accuracy "$MIN_ACCURACY"
status=$?
set -e
job=$(ctl jobs | awk 'NR > 1 { id = $1 } END { print id }')
if [ -n "$job" ]; then
  echo
  ctl plan "$job" || true
fi
if [ $status -ne 0 ]; then
  echo "demo: the job did not reach its target (exit $status); logs follow" >&2
  tail -n 20 "$run_dir"/*.log >&2 || true
  exit $status
fi
echo
echo "demo: done; stopping the cluster"
