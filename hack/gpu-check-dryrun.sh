#!/usr/bin/env bash
# gpu-check-dryrun.sh — runs hack/gpu-check.sh on a machine without a GPU, against fakes: an
# nvidia-smi that lists two H100s and reads MIG instances from the CDI specs bcd writes, and a
# bcd whose node runs on fake hardware (--fake-gpus 2, MIG through hardware.FakeMIG) and whose
# doctor reports NVML as read. It proves the script's flow (the devserver, the API calls, join,
# the specs, the MIG steps, the report, the cleanup), not anything about a GPU.
#
# It runs the script twice: once where everything agrees (exit 0 expected), once where
# nvidia-smi lists other UUIDs than bcd's (the "whole" step must fail, exit 1). It needs Go,
# curl, jq and PostgreSQL's server binaries, as the devserver does. Exit 0 when both behave.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
DIR=$(mktemp -d /tmp/gpu-check-dryrun.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
mkdir -p "$DIR/bin"
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
go build -o "$DIR/bcd" ./bcd || exit 1
go build -o "$DIR/devserver" ./examples/devserver || exit 1
echo '{"fake": {"gpus": 2}}' >"$DIR/fake.json"

cat >"$DIR/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
# A fake nvidia-smi over bcd's fake hardware (node gpu-check, 2 GPUs).
dir=$(dirname "$0")/..
prefix=${FAKE_UUID_PREFIX:-GPU-fake-gpu-check}
specs() { [ -f "$dir/cdi-dir" ] && cat "$(cat "$dir/cdi-dir")"/better-compute-*.json 2>/dev/null; }
case "$*" in
  -L)
    for i in 0 1; do
      echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: $prefix-$i)"
      specs | grep -o "NVIDIA_VISIBLE_DEVICES=MIG-fake-$i-[0-9]*" | cut -d= -f2 | while read -r u; do
        echo "  MIG 3g.40gb     Device  0: (UUID: $u)"
      done
    done ;;
  *mig.mode.current*) echo "Disabled" ;;
  *driver_version*--format=csv,noheader*) echo "000.0-fake" ;;
  --query-gpu=*) echo "index, uuid"; echo "0, $prefix-0"; echo "1, $prefix-1" ;;
  "mig -lgi -i "*)
    i=${!#}
    parts=$(specs | grep -o "GPU-fake-gpu-check-$i:mig=[^\"]*")
    if [ -z "$parts" ]; then echo "No GPU instances found: Not Found"; exit 6; fi
    echo "$parts" | while read -r p; do
      prof=${p#*mig=}; prof=${prof%@*}; start=${p##*@}
      echo "|   $i  MIG $prof          9        1          $start:4     |"
    done ;;
  *) echo "fake nvidia-smi: $*" >&2; exit 1 ;;
esac
EOF

cat >"$DIR/bin/bcd" <<EOF
#!/usr/bin/env bash
# bcd on fake hardware; doctor's nvml check reads as ok, as it would with a GPU.
case "\$1" in
  node)
    prev=
    for a in "\$@"; do [ "\$prev" = --cdi-dir ] && echo "\$a" >"$DIR/cdi-dir"; prev=\$a; done
    exec "$DIR/bcd" "\$@" --fake-gpus 2 ;;
  doctor)
    "$DIR/bcd" "\$@" --config "$DIR/fake.json" >"$DIR/doctor.out"
    rc=\$?
    jq '(.checks[] | select(.name == "nvml")) |= (.status = "ok" | .detail = "2 GPUs (fake)")' "$DIR/doctor.out"
    exit \$rc ;;
  *) exec "$DIR/bcd" "\$@" ;;
esac
EOF
chmod +x "$DIR/bin/nvidia-smi" "$DIR/bin/bcd"

run() {
  PATH="$DIR/bin:$PATH" BCD_BIN="$DIR/bin/bcd" DEVSERVER_BIN="$DIR/devserver" GPU_CHECK_TIMEOUT=60 \
    hack/gpu-check.sh "$DIR/report-$1" >"$DIR/out-$1" 2>&1
}
ok=1
run agree
code=$?
if [ $code != 0 ]; then
  echo "dry run: gpu-check.sh exited $code where everything agrees:" >&2
  cat "$DIR/out-agree" "$DIR/report-agree/report.txt" >&2
  ok=0
elif ! jq -e '.ok and ([.steps[].status] == ["pass","pass","pass","pass","pass","pass","pass","pass","pass"])' "$DIR/report-agree/report.json" >/dev/null; then
  echo "dry run: the report does not say every step passed:" >&2
  cat "$DIR/report-agree/report.json" >&2
  ok=0
fi
FAKE_UUID_PREFIX=GPU-other run disagree
code=$?
if [ $code != 1 ] || ! grep -q "FAIL at whole: the spec names GPU-fake-gpu-check-0, which nvidia-smi -L does not list" "$DIR/out-disagree" ||
  ! jq -e '.steps[-1] | .name == "whole" and .status == "fail"' "$DIR/report-disagree/report.json" >/dev/null; then
  echo "dry run: gpu-check.sh exited $code where nvidia-smi disagrees with bcd, want 1 at the whole step:" >&2
  cat "$DIR/out-disagree" >&2
  ok=0
fi
if [ $ok = 1 ]; then
  cat "$DIR/report-agree/report.txt"
  echo "dry run: gpu-check.sh passes on fakes, and fails at the first step that disagrees"
  exit 0
fi
exit 1
