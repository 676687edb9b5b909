#!/usr/bin/env bash
# Regenerates the Go code of the node protocol from agent.proto. The plugins come from the Go
# module proxy at pinned versions; protoc is Debian's protobuf-compiler (apt-get install
# protobuf-compiler). With --check it writes to a temporary directory and fails when the
# committed code differs.
set -euo pipefail
cd "$(dirname "$0")"
bin=$(mktemp -d)
tmp=
trap 'rm -rf "$bin" ${tmp:+"$tmp"}' EXIT
for m in google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12 \
         google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1 \
         connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1; do
  GOBIN="$bin" go install "$m"
done
command -v protoc >/dev/null || { echo "generate.sh: protoc not found: apt-get install protobuf-compiler" >&2; exit 1; }
out=.
if [ "${1:-}" = "--check" ]; then tmp=$(mktemp -d); out=$tmp; fi
PATH="$bin:$PATH" protoc -I . \
  --go_out="$out" --go_opt=paths=source_relative \
  --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
  --connect-go_out="$out" --connect-go_opt=paths=source_relative \
  agent.proto
if [ "$out" != . ]; then
  for f in agent.pb.go agent_grpc.pb.go agentv1connect/agent.connect.go; do
    if ! cmp -s "$f" "$out/$f"; then
      echo "generate.sh: agent/v1/$f is stale: run agent/v1/generate.sh" >&2
      exit 1
    fi
  done
fi
