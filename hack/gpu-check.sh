#!/usr/bin/env bash
# shellcheck disable=SC2317 # the wait conditions are functions only wait_for calls
# gpu-check.sh REPORT_DIR — bcd on a machine with an NVIDIA GPU, end to end, against a devserver
# on loopback. Run from anywhere in the repository, as root (bcd makes MIG instances and writes
# CDI specs):
#
#   hack/gpu-check.sh /tmp/gpu-report
#
# Steps, in order; the first that fails ends the run:
#   gpu       nvidia-smi lists the GPUs (none: "no NVIDIA GPU", exit 2)
#   tools     go, curl, jq and PostgreSQL's initdb (or BETTER_COMPUTE_DATABASE_URL) are here
#   build     bcd (with cgo, for NVML) and the devserver
#   doctor    bcd doctor --json before joining: NVML must read the GPUs
#   devserver the control plane on loopback, its URL and API key
#   join      a pool and a join token through the API, bcd join, bcd node; the node online
#             with as many GPUs as nvidia-smi lists
#   doctor-node bcd doctor --json of the running node: no check may fail
#   whole     a whole GPU booked: its CDI spec names that GPU's UUID, which nvidia-smi -L lists;
#             released: the spec goes
#   mig       (on a MIG-capable GPU; else skipped) the GPU switched to mig, a 3g slice booked:
#             its CDI spec names a MIG device that nvidia-smi -L lists, nvidia-smi mig -lgi
#             shows the GPU instance at the start the booking names; released: the instance
#             goes; the GPU switched back to whole: MIG mode disabled
#
# It writes REPORT_DIR/report.json and report.txt (each step: name, status, detail, seconds),
# with what it read (nvidia-smi, doctor reports, CDI specs, API answers, logs) beside them.
# Exit codes: 0 every step passed; 1 a step failed (stderr and the report say which and why);
# 2 no NVIDIA GPU here; 64 bad usage.
#
# Environment: BCD_BIN and DEVSERVER_BIN use prebuilt binaries instead of building (a machine
# without the Go module proxy); GPU_CHECK_API_PORT and GPU_CHECK_GATEWAY_PORT (default 18080 and
# 18443) are the devserver's loopback ports; GPU_CHECK_TIMEOUT (default 120) bounds each wait
# in seconds.
set -uo pipefail

if [ $# -ne 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '3,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  [ $# -eq 1 ] && exit 0
  exit 64
fi
REPORT=$1
mkdir -p "$REPORT" || { echo "gpu-check: cannot make the report directory $REPORT" >&2; exit 64; }
REPORT=$(cd "$REPORT" && pwd)
cd "$(dirname "$0")/.." || exit 1
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
API_PORT=${GPU_CHECK_API_PORT:-18080}
GW_PORT=${GPU_CHECK_GATEWAY_PORT:-18443}
TIMEOUT=${GPU_CHECK_TIMEOUT:-120}
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)

STEPS=()   # name<TAB>status<TAB>seconds<TAB>detail
STEP=""
STEP_T0=0
DEVSERVER_PID=""
NODE_PID=""
URL=""
KEY=""
RESERVATIONS=()  # booked and not yet released, released again on the way out
MIG_DEVICE=""    # a device switched to mig, switched back on the way out
MIG_INDEX=""

# json_str S: S as a JSON string.
json_str() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/}
  s=${s//$'\t'/\\t}
  printf '"%s"' "$s"
}

step() {
  STEP=$1
  STEP_T0=$SECONDS
  echo "gpu-check: $STEP: $2"
}

record() { # status detail
  STEPS+=("$STEP"$'\t'"$1"$'\t'"$((SECONDS - STEP_T0))"$'\t'"$2")
}

pass() {
  record pass "$1"
  echo "gpu-check: $STEP: ok: $1"
}

write_report() { # exit-code
  local code=$1 ok=false first=1 line name status secs detail
  [ "$code" = 0 ] && ok=true
  {
    printf '{\n  "version": 1,\n  "ok": %s,\n  "exitCode": %s,\n  "host": %s,\n  "started": %s,\n  "finished": %s,\n  "steps": [' \
      "$ok" "$code" "$(json_str "$(hostname)")" "$(json_str "$STARTED")" "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")"
    for line in "${STEPS[@]}"; do
      IFS=$'\t' read -r name status secs detail <<<"$line"
      [ $first = 1 ] || printf ','
      first=0
      printf '\n    {"name": %s, "status": %s, "seconds": %s, "detail": %s}' \
        "$(json_str "$name")" "$(json_str "$status")" "$secs" "$(json_str "$detail")"
    done
    printf '\n  ]\n}\n'
  } >"$REPORT/report.json"
  {
    echo "bcd GPU check on $(hostname), started $STARTED: $([ "$ok" = true ] && echo PASSED || echo "FAILED (exit $code)")"
    for line in "${STEPS[@]}"; do
      IFS=$'\t' read -r name status secs detail <<<"$line"
      printf '%-12s %-5s %4ss  %s\n' "$name" "$status" "$secs" "$detail"
    done
  } >"$REPORT/report.txt"
}

# finish CODE: undo what this run did to the machine, stop what it started, write the report.
finish() {
  local code=$1
  trap - EXIT INT TERM
  if [ -n "$URL" ] && [ -n "$DEVSERVER_PID" ] && kill -0 "$DEVSERVER_PID" 2>/dev/null; then
    local r
    for r in "${RESERVATIONS[@]}"; do
      api reservations/release "{\"reservation\":\"$r\"}" >/dev/null 2>&1 || true
    done
    if [ -n "$MIG_DEVICE" ]; then
      echo "gpu-check: cleanup: switching GPU $MIG_INDEX back to whole" >&2
      api devices/setMode "{\"device\":\"$MIG_DEVICE\",\"mode\":\"whole\"}" >/dev/null 2>&1 || true
      wait_for 60 "GPU $MIG_INDEX out of MIG mode" mig_disabled "$MIG_INDEX" >/dev/null 2>&1 || true
    fi
  fi
  if [ -n "$NODE_PID" ] && kill -0 "$NODE_PID" 2>/dev/null; then
    kill -TERM "$NODE_PID" 2>/dev/null
    wait "$NODE_PID" 2>/dev/null
  fi
  if [ -n "$DEVSERVER_PID" ] && kill -0 "$DEVSERVER_PID" 2>/dev/null; then
    kill -TERM "$DEVSERVER_PID" 2>/dev/null
    wait "$DEVSERVER_PID" 2>/dev/null
  fi
  [ -f "$WORK/bcd-node.log" ] && cp "$WORK/bcd-node.log" "$REPORT/"
  [ -f "$WORK/devserver.log" ] && cp "$WORK/devserver.log" "$REPORT/"
  write_report "$code"
  rm -rf "$WORK"
  echo "gpu-check: report in $REPORT/report.json and $REPORT/report.txt"
  exit "$code"
}
trap 'record fail "interrupted"; finish 1' INT TERM
trap 'finish $?' EXIT

fail() {
  record fail "$1"
  echo "gpu-check: FAIL at $STEP: $1" >&2
  finish 1
}

# wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds, or fail.
wait_for() {
  local limit=$1 what=$2
  shift 2
  local t0=$SECONDS
  until "$@"; do
    if [ $((SECONDS - t0)) -ge "$limit" ]; then
      echo "timed out after ${limit}s waiting for $what"
      return 1
    fi
    sleep 1
  done
}

# api METHOD BODY: POST to the API; the answer on stdout; an error answer fails with its message.
api() {
  local out code
  out=$(curl -sS -X POST -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
    --max-time 60 -w $'\n%{http_code}' -d "$2" "$URL/api/compute/$1" 2>&1) || {
    echo "POST $1: $out"
    return 1
  }
  code=${out##*$'\n'}
  out=${out%$'\n'*}
  if [ "$code" != 200 ]; then
    echo "POST $1 answered $code: $(jq -r '.error.code + ": " + .error.message' <<<"$out" 2>/dev/null || echo "$out")"
    return 1
  fi
  printf '%s\n' "$out"
}

spec_of() { echo "$WORK/cdi/better-compute-$1.json"; }
spec_names() { [ -f "$(spec_of "$1")" ] && grep -q "NVIDIA_VISIBLE_DEVICES=$2" "$(spec_of "$1")"; }
spec_gone() { [ ! -e "$(spec_of "$1")" ]; }
mig_mode() { nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader -i "$1" 2>/dev/null | tr -d ' '; }
mig_disabled() { [ "$(mig_mode "$1")" = Disabled ]; }

# ---------------------------------------------------------------------------------------------
step gpu "looking for NVIDIA GPUs"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  if [ -d /proc/driver/nvidia/gpus ] && [ -n "$(ls -A /proc/driver/nvidia/gpus 2>/dev/null)" ]; then
    fail "the NVIDIA driver is loaded but nvidia-smi is not on PATH: install it (nvidia-utils)"
  fi
  record none "no NVIDIA GPU: nvidia-smi is not installed and no NVIDIA driver is loaded"
  echo "gpu-check: no NVIDIA GPU on this machine (no nvidia-smi, no /proc/driver/nvidia/gpus): nothing to check" >&2
  finish 2
fi
if ! nvidia-smi -L >"$REPORT/nvidia-smi-L.txt" 2>&1; then
  fail "nvidia-smi -L failed: $(head -c 400 "$REPORT/nvidia-smi-L.txt")"
fi
NGPUS=$(grep -c '^GPU [0-9]' "$REPORT/nvidia-smi-L.txt")
if [ "$NGPUS" = 0 ]; then
  record none "no NVIDIA GPU: nvidia-smi lists none"
  echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi -L lists none)" >&2
  finish 2
fi
nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current,driver_version --format=csv >"$REPORT/gpus.csv" 2>&1
pass "$NGPUS GPUs: $(sed -n 's/^GPU 0: \(.*\) (UUID.*/\1/p' "$REPORT/nvidia-smi-L.txt") (driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader -i 0 2>/dev/null))"

step tools "go, curl, jq, PostgreSQL"
for tool in curl jq; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool is not installed (Debian: apt-get install $tool)"
done
if [ -z "${BCD_BIN:-}" ] || [ -z "${DEVSERVER_BIN:-}" ]; then
  command -v go >/dev/null 2>&1 || fail "go is not installed, and BCD_BIN and DEVSERVER_BIN do not name prebuilt binaries"
fi
if [ -z "${BETTER_COMPUTE_DATABASE_URL:-}" ] && ! command -v initdb >/dev/null 2>&1 &&
  ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  fail "the devserver needs PostgreSQL's server binaries (Debian: apt-get install postgresql) or BETTER_COMPUTE_DATABASE_URL"
fi
[ "$(id -u)" = 0 ] || fail "run as root: bcd makes MIG instances and changes MIG modes through NVML"
pass "all here"

step build "bcd with cgo, and the devserver"
export CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
BCD=${BCD_BIN:-$WORK/bcd}
DEVSERVER=${DEVSERVER_BIN:-$WORK/devserver}
if [ -z "${BCD_BIN:-}" ]; then
  go build -o "$BCD" ./bcd >"$WORK/build.log" 2>&1 || fail "go build ./bcd: $(tail -c 600 "$WORK/build.log")"
fi
if [ -z "${DEVSERVER_BIN:-}" ]; then
  go build -o "$DEVSERVER" ./examples/devserver >"$WORK/build.log" 2>&1 || fail "go build ./examples/devserver: $(tail -c 600 "$WORK/build.log")"
fi
"$BCD" version >"$REPORT/bcd-version.txt" 2>&1 || fail "$BCD does not run: $(cat "$REPORT/bcd-version.txt")"
pass "$(cat "$REPORT/bcd-version.txt")"

step doctor "bcd doctor --json, before joining"
mkdir -p "$WORK/state" "$WORK/cdi"
# The node has not joined yet, so the identity check fails; what matters here is NVML.
"$BCD" doctor --json --state-dir "$WORK/state" --cdi-dir "$WORK/cdi" >"$REPORT/doctor-before.json" 2>"$WORK/doctor.err"
jq -e '.version == 1' "$REPORT/doctor-before.json" >/dev/null 2>&1 ||
  fail "bcd doctor --json wrote no report: $(head -c 400 "$REPORT/doctor-before.json") $(cat "$WORK/doctor.err")"
NVML=$(jq -r '.checks[] | select(.name == "nvml") | .status + ": " + .detail' "$REPORT/doctor-before.json")
case $NVML in ok:*) ;; *) fail "bcd doctor's nvml check: $NVML" ;; esac
pass "nvml $NVML; mig $(jq -r '.checks[] | select(.name == "mig") | .status + ": " + .detail' "$REPORT/doctor-before.json"); cgroup $(jq -r '.checks[] | select(.name == "cgroup") | .status' "$REPORT/doctor-before.json")"

step devserver "the control plane on 127.0.0.1:$API_PORT (gateway :$GW_PORT)"
"$DEVSERVER" --listen "127.0.0.1:$API_PORT" --gateway-listen "127.0.0.1:$GW_PORT" >"$WORK/devserver.log" 2>&1 &
DEVSERVER_PID=$!
devserver_ready() {
  kill -0 "$DEVSERVER_PID" 2>/dev/null || return 2
  grep -q 'API key:' "$WORK/devserver.log"
}
if ! wait_for "$TIMEOUT" "the devserver" devserver_ready >"$WORK/wait" || ! kill -0 "$DEVSERVER_PID" 2>/dev/null; then
  fail "the devserver did not start: $(cat "$WORK/wait") $(tail -c 800 "$WORK/devserver.log")"
fi
URL=$(sed -n 's/^ *URL: *//p' "$WORK/devserver.log" | head -n1)
KEY=$(sed -n 's/^ *API key: *//p' "$WORK/devserver.log" | head -n1)
if [ -z "$URL" ] || [ -z "$KEY" ]; then
  fail "the devserver printed no URL or API key: $(head -c 600 "$WORK/devserver.log")"
fi
pass "$URL"

step join "a pool, a join token, bcd join, bcd node"
api pools/create '{"name":"gpucheck"}' >"$REPORT/pool.json" || fail "$(cat "$REPORT/pool.json")"
api joinTokens/create '{"pool":"gpucheck"}' >"$WORK/token.json" || fail "$(cat "$WORK/token.json")"
TOKEN=$(jq -r .token "$WORK/token.json")
CAHASH=$(jq -r '.caHash // ""' "$WORK/token.json")
JOIN=("$BCD" join --state-dir "$WORK/state" --url "$URL" --token "$TOKEN" --hostname gpu-check)
[ -n "$CAHASH" ] && JOIN+=(--ca-hash "$CAHASH")
"${JOIN[@]}" >"$REPORT/join.txt" 2>&1 || fail "bcd join: $(cat "$REPORT/join.txt")"
"$BCD" node --state-dir "$WORK/state" --cdi-dir "$WORK/cdi" >"$WORK/bcd-node.log" 2>&1 &
NODE_PID=$!
node_online() {
  kill -0 "$NODE_PID" 2>/dev/null || return 1
  api nodes/list '{"pool":"gpucheck"}' >"$WORK/nodes.json" 2>/dev/null || return 1
  NODE_ID=$(jq -r '.items[0] | select(.status == "online") | .id' "$WORK/nodes.json")
  [ -n "$NODE_ID" ] || return 1
  api devices/list "{\"node\":\"$NODE_ID\"}" >"$REPORT/devices.json" 2>/dev/null || return 1
  [ "$(jq length "$REPORT/devices.json")" = "$NGPUS" ]
}
NODE_ID=""
wait_for "$TIMEOUT" "the node online with $NGPUS GPUs" node_online >"$WORK/wait" ||
  fail "$(cat "$WORK/wait"); bcd node: $(tail -c 800 "$WORK/bcd-node.log")"
pass "node $NODE_ID online with $NGPUS GPUs: $(jq -r '[.[] | .model + " " + .mode] | join(", ")' "$REPORT/devices.json")"

step doctor-node "bcd doctor --json of the running node"
"$BCD" doctor --json --state-dir "$WORK/state" --cdi-dir "$WORK/cdi" >"$REPORT/doctor.json" 2>"$WORK/doctor.err"
jq -e '.ok == true' "$REPORT/doctor.json" >/dev/null 2>&1 ||
  fail "checks failed: $(jq -r '[.checks[] | select(.status == "fail") | .name + ": " + .detail] | join("; ")' "$REPORT/doctor.json" 2>/dev/null || cat "$WORK/doctor.err")"
pass "$(jq -r '[.checks[] | .name + " " + .status] | join(", ")' "$REPORT/doctor.json")"

step whole "a whole GPU booked and released"
api reservations/create '{"pool":"gpucheck","gpus":1}' >"$REPORT/whole-reservation.json" || fail "$(cat "$REPORT/whole-reservation.json")"
RID=$(jq -r .id "$REPORT/whole-reservation.json")
RESERVATIONS+=("$RID")
UUID=$(jq -r '.allocations[0].gpus[0].uuid' "$REPORT/whole-reservation.json")
INDEX=$(jq -r '.allocations[0].gpus[0].index' "$REPORT/whole-reservation.json")
wait_for "$TIMEOUT" "the CDI spec of $RID" spec_names "$RID" "$UUID" >"$WORK/wait" ||
  fail "$(cat "$WORK/wait"): no spec naming $UUID; bcd node: $(tail -c 800 "$WORK/bcd-node.log")"
cp "$(spec_of "$RID")" "$REPORT/whole-spec.json"
grep -q "(UUID: $UUID)" "$REPORT/nvidia-smi-L.txt" || fail "the spec names $UUID, which nvidia-smi -L does not list"
api reservations/release "{\"reservation\":\"$RID\"}" >/dev/null || fail "release $RID"
RESERVATIONS=()
wait_for "$TIMEOUT" "the spec of $RID removed" spec_gone "$RID" >"$WORK/wait" || fail "$(cat "$WORK/wait")"
pass "GPU $INDEX ($UUID) in the spec of $RID, which went on release"

step mig "a GPU switched to MIG, a 3g slice booked and released, the GPU back to whole"
MIG_INDEX=""
for i in $(seq $((NGPUS - 1)) -1 0); do
  mode=$(mig_mode "$i")
  profiles=$(jq -r --argjson i "$i" '.[] | select(.index == $i) | (.migProfiles // []) | length' "$REPORT/devices.json")
  if [ "$mode" != "[N/A]" ] && [ -n "$mode" ] && [ "${profiles:-0}" -gt 0 ]; then
    MIG_INDEX=$i
    break
  fi
done
if [ -z "$MIG_INDEX" ]; then
  record skip "no MIG-capable GPU (nvidia-smi's mig.mode.current is [N/A], or the control plane knows no MIG profiles of the model)"
  echo "gpu-check: mig: skipped: no MIG-capable GPU"
  finish 0
fi
DEVICE=$(jq -r --argjson i "$MIG_INDEX" '.[] | select(.index == $i) | .id' "$REPORT/devices.json")
MODEL=$(jq -r --argjson i "$MIG_INDEX" '.[] | select(.index == $i) | .model' "$REPORT/devices.json")
PROFILE=$(jq -r --argjson i "$MIG_INDEX" '.[] | select(.index == $i) | .migProfiles[] | select(startswith("3g."))' "$REPORT/devices.json" | head -n1)
[ -n "$PROFILE" ] || fail "the control plane lists no 3g profile of $MODEL: $(jq -c --argjson i "$MIG_INDEX" '.[] | select(.index == $i) | .migProfiles' "$REPORT/devices.json")"
api devices/setMode "{\"device\":\"$DEVICE\",\"mode\":\"mig\"}" >"$WORK/setmode.json" || fail "$(cat "$WORK/setmode.json")"
MIG_DEVICE=$DEVICE
api reservations/create "{\"pool\":\"gpucheck\",\"model\":\"$MODEL\",\"migProfile\":\"$PROFILE\"}" >"$REPORT/mig-reservation.json" ||
  fail "$(cat "$REPORT/mig-reservation.json")"
RID=$(jq -r .id "$REPORT/mig-reservation.json")
RESERVATIONS+=("$RID")
START=$(jq -r '.allocations[0].gpus[0].migStart // 0' "$REPORT/mig-reservation.json")
BOOKED=$(jq -r '.allocations[0].gpus[0].index' "$REPORT/mig-reservation.json")
[ "$BOOKED" = "$MIG_INDEX" ] || fail "the slice was booked on GPU $BOOKED, not on GPU $MIG_INDEX, the one switched to MIG"
if ! wait_for "$TIMEOUT" "a MIG device in the spec of $RID" spec_names "$RID" "MIG-" >"$WORK/wait"; then
  fail "$(cat "$WORK/wait"); MIG mode of GPU $MIG_INDEX: $(mig_mode "$MIG_INDEX"); bcd node: $(grep -i mig "$WORK/bcd-node.log" | tail -n 5)"
fi
cp "$(spec_of "$RID")" "$REPORT/mig-spec.json"
MIGUUID=$(grep -o 'NVIDIA_VISIBLE_DEVICES=MIG-[^",]*' "$REPORT/mig-spec.json" | head -n1 | cut -d= -f2)
nvidia-smi -L >"$REPORT/nvidia-smi-L-mig.txt" 2>&1
grep -q "UUID: $MIGUUID)" "$REPORT/nvidia-smi-L-mig.txt" || fail "the spec names $MIGUUID, which nvidia-smi -L does not list: $(cat "$REPORT/nvidia-smi-L-mig.txt")"
nvidia-smi mig -lgi -i "$MIG_INDEX" >"$REPORT/nvidia-smi-mig-lgi.txt" 2>&1
grep -Eq "^\|[[:space:]]+${MIG_INDEX}[[:space:]]+MIG ${PROFILE}[[:space:]]+[0-9]+[[:space:]]+[0-9]+[[:space:]]+${START}:[0-9]+" "$REPORT/nvidia-smi-mig-lgi.txt" ||
  fail "nvidia-smi mig -lgi shows no $PROFILE instance at start $START on GPU $MIG_INDEX: $(cat "$REPORT/nvidia-smi-mig-lgi.txt")"
api reservations/release "{\"reservation\":\"$RID\"}" >/dev/null || fail "release $RID"
RESERVATIONS=()
wait_for "$TIMEOUT" "the spec of $RID removed" spec_gone "$RID" >"$WORK/wait" || fail "$(cat "$WORK/wait")"
no_instances() { ! nvidia-smi mig -lgi -i "$MIG_INDEX" 2>&1 | grep -q "MIG $PROFILE"; }
wait_for "$TIMEOUT" "the GPU instance destroyed" no_instances >"$WORK/wait" ||
  fail "$(cat "$WORK/wait"): $(nvidia-smi mig -lgi -i "$MIG_INDEX" 2>&1)"
api devices/setMode "{\"device\":\"$DEVICE\",\"mode\":\"whole\"}" >"$WORK/setmode.json" || fail "$(cat "$WORK/setmode.json")"
wait_for "$TIMEOUT" "GPU $MIG_INDEX out of MIG mode" mig_disabled "$MIG_INDEX" >"$WORK/wait" ||
  fail "$(cat "$WORK/wait"): mig.mode.current is $(mig_mode "$MIG_INDEX") (a change pending a GPU reset?); bcd node: $(grep -i mig "$WORK/bcd-node.log" | tail -n 5)"
MIG_DEVICE=""
pass "GPU $MIG_INDEX: $PROFILE at $START as $MIGUUID (listed by nvidia-smi -L and mig -lgi), destroyed on release, MIG mode disabled again"
finish 0
