#!/usr/bin/env bash
# Checkpoint figures (issue 5): starts a MinIO server on a free loopback port
# with a temporary data directory, runs "phalanx bench checkpoint" against it
# (which measures plain minio-go PutObject/GetObject of the same bytes in the
# same run as the reference), and stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-minio
minio="$(go env GOPATH)/bin/minio"
data=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export MINIO_ROOT_USER=phalanx-bench MINIO_ROOT_PASSWORD=phalanx-bench-secret MINIO_BROWSER=off
export AWS_ACCESS_KEY_ID=$MINIO_ROOT_USER AWS_SECRET_ACCESS_KEY=$MINIO_ROOT_PASSWORD
"$minio" server "$data" --address "127.0.0.1:$port" --console-address 127.0.0.1:0 --quiet &
pid=$!
trap 'kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/minio/health/ready" >/dev/null && break
  sleep 0.1
done
go run ./cmd/phalanx bench checkpoint --checkpoint "s3://bench/ckpt?endpoint=127.0.0.1:$port" "$@"
