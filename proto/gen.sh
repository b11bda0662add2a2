#!/usr/bin/env bash
# Regenerates internal/e2b/gen from the E2B-compatible protos. Needs protoc
# (apt: protobuf-compiler) and the two plugins:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1
set -euo pipefail
cd "$(dirname "$0")"
export PATH=$PATH:$(go env GOPATH)/bin
out=../internal/e2b/gen
mkdir -p "$out"
protoc -I . -I /usr/include \
  --go_out="$out" --go_opt=module=github.com/space-sandbox/space/internal/e2b/gen \
  --connect-go_out="$out" --connect-go_opt=module=github.com/space-sandbox/space/internal/e2b/gen \
  process/process.proto filesystem/filesystem.proto
