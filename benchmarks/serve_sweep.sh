#!/usr/bin/env bash
# Request-rate sweep of `hotspec serve`, vanilla and speculative, in one shot:
# start both servers side by side, wait for /health, run benchmarks/load_test.py against each
# (Poisson rates, streaming clients, 10 % hang-ups, greedy spot check), write the JSON to $OUT,
# stop the servers. Exit status: load_test's (1 when any check failed), or 2 when a server did not
# come up. The caller sets PYTHONPATH: the repo, and on the GPU /tmp/site with the carried wheels
# and the default model, as lab/gpu_job.sh stages them.
#   bash benchmarks/serve_sweep.sh
# Knobs (environment; defaults meant for one H200 and SmolLM2-135M within ~150 s, unmeasured):
#   SERVE_ARGS  engine options for both servers (default: --kv-cache-memory-gb 8)
#   SPEC_ARGS   the speculative server's extra options; SPEC_ARGS=none runs vanilla only.
#               Skipped, with a note, when its --speculative-draft-model-path does not exist.
#   LOAD_ARGS   benchmarks/load_test.py options (rates, requests, lengths, ...)
#   START_S     seconds to wait for both servers to be healthy (default 120)
#   PY, OUT, LOGDIR, PORT (vanilla; PORT+1 speculative)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-/tmp/hotspec_sweep}
LOGDIR=${LOGDIR:-/tmp/hotspec_sweep_logs}
PORT=${PORT:-30000}
START_S=${START_S:-120}
SERVE_ARGS=${SERVE_ARGS:---kv-cache-memory-gb 8}
HEAD=hotspec/assets/smollm2-eagle3
SPEC_ARGS=${SPEC_ARGS:---speculative-algorithm EAGLE3 --speculative-draft-model-path $HEAD \
--speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 16}
LOAD_ARGS=${LOAD_ARGS:---num-requests 200 --concurrency 64 --rates 4,16,64,inf --max-arrival-s 8 \
--min-prompt-words 4 --max-prompt-words 200 --min-tokens 16 --max-tokens 256 --verify-greedy 8 \
--timeout 60 --drain-timeout 20}
mkdir -p "$OUT" "$LOGDIR"
export PYTHONUNBUFFERED=1

if [ "$SPEC_ARGS" != none ]; then
  read -ra spec <<< "$SPEC_ARGS"
  for i in "${!spec[@]}"; do
    if [ "${spec[$i]}" = --speculative-draft-model-path ] && [ ! -e "${spec[$((i + 1))]}" ]; then
      echo "serve_sweep: no draft head at ${spec[$((i + 1))]}: vanilla only"
      SPEC_ARGS=none
    fi
  done
fi

names=(vanilla) ports=("$PORT") pids=()
[ "$SPEC_ARGS" != none ] && names+=(spec) && ports+=($((PORT + 1)))

http_get() {  # http_get PORT PATH: the response (status line first); bash only, no curl needed
  { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
  timeout 10 cat <&3
  exec 3<&-
}

stop_servers() {  # SIGINT (graceful), then SIGKILL whatever is left after 15 s
  for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null; done
  for _ in $(seq 30); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return
    sleep 0.5
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
}
lt=""
on_signal() {  # `timeout` (lab/gpu_job.sh's step) or ^C: stop the load test, then the servers
  [ -n "$lt" ] && kill -INT "$lt" 2>/dev/null
  exit 143
}
trap stop_servers EXIT
trap on_signal TERM INT

t0=$(date +%s)
for i in "${!names[@]}"; do
  # The vanilla server must not speculate: with no --model, `hotspec serve` speculates with the
  # default model's shipped head unless told --no-default-head.
  extra="--no-default-head"
  [ "${names[$i]}" = spec ] && extra=$SPEC_ARGS
  # shellcheck disable=SC2086  # option strings split into words on purpose
  $PY -m hotspec.cli.main serve $SERVE_ARGS $extra --port "${ports[$i]}" \
    >"$LOGDIR/serve_${names[$i]}.log" 2>&1 &
  pids+=($!)
  echo "serve_sweep: ${names[$i]} server pid $! on port ${ports[$i]}: serve $SERVE_ARGS $extra"
done

for i in "${!names[@]}"; do
  until http_get "${ports[$i]}" /health | head -n 1 | grep -q " 200 "; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null || [ $(($(date +%s) - t0)) -ge "$START_S" ]; then
      echo "serve_sweep: ${names[$i]} server did not come up in ${START_S}s; its log ends:"
      tail -n 40 "$LOGDIR/serve_${names[$i]}.log"
      exit 2
    fi
    sleep 0.5
  done
  echo "serve_sweep: ${names[$i]} healthy after $(($(date +%s) - t0))s"
  metrics=$(http_get "${ports[$i]}" /metrics)
  grep -E "^hotspec_(cuda_graph_batch_sizes|kv_blocks_total)" <<< "$metrics"
  if [ "${names[$i]}" = vanilla ] && grep -q "^hotspec_hot_set_coverage" <<< "$metrics"; then
    echo "serve_sweep: the vanilla server is speculating (it exports hot-set coverage): not a baseline"
    exit 2
  fi
done

targets=()
for i in "${!names[@]}"; do targets+=(--target "${names[$i]}=http://127.0.0.1:${ports[$i]}"); done
# shellcheck disable=SC2086
$PY benchmarks/load_test.py "${targets[@]}" $LOAD_ARGS --out "$OUT/serve_sweep.json" &
lt=$!
wait "$lt"  # in the background so that a signal is handled at once
rc=$?
lt=""
stop_servers
trap - EXIT
for n in "${names[@]}"; do  # errors the servers logged (tracebacks, warnings), if any
  grep -E -m5 "Traceback|ERROR|WARNING" "$LOGDIR/serve_$n.log" | sed "s/^/serve_sweep: $n log: /"
done
echo "serve_sweep: rc=$rc after $(($(date +%s) - t0))s; JSON in $OUT/serve_sweep.json"
exit $rc
