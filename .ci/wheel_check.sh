#!/usr/bin/env bash
# The wheel as a user gets it: installed in a fresh virtualenv (this checkout is not on the
# path), then what a user does first. `make wheel-check` builds it and runs this:
#
#   .ci/wheel_check.sh dist/app_toolkit-VERSION-py3-none-any.whl
#
# Each check prints a line; the first that fails ends the script with status 1 and what
# it saw. Every step has a time limit (at most about 45 minutes in all; a few minutes
# when it passes: docs/benchmarks.md, "Install size"). PYTHON picks the interpreter.
set -euo pipefail

wheel=$(realpath "${1:?usage: .ci/wheel_check.sh dist/app_toolkit-VERSION-py3-none-any.whl}")
work=$(mktemp -d)
venv=$work/venv
bin=$venv/bin
server=""
began=$SECONDS

fail() {
    echo "FAIL $*" >&2
    exit 1
}
ok() { printf 'ok   %-22s %s\n' "$1" "$2"; }
# Its last lines, after a failure.
show() { tail -n "${2:-40}" "$1" >&2; }

cleanup() {
    # Only if a check failed while it served: its process group (Ray's processes with it).
    if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
        kill -KILL -- "-$server" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# As a user: none of this checkout's environment (its venv, import path, Ray, make).
unset VIRTUAL_ENV PYTHONPATH RAY_ADDRESS MAKEFLAGS MFLAGS MAKELEVEL
export RAY_USAGE_STATS_ENABLED=0
cd "$work"

# --- the install -----------------------------------------------------------------------
"${PYTHON:-python3}" -m venv "$venv"
start=$SECONDS
timeout 900 "$bin/pip" install --quiet "$wheel" >"$work/install.log" 2>&1 ||
    { show "$work/install.log"; fail "pip install $wheel"; }
site=$("$bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ok install "$(du -sm "$site" | cut -f1) MB in site-packages, $("$bin/pip" list --format=freeze | wc -l) distributions (pip list), $((SECONDS - start)) s"

# --- the package: where it is imported from, its version, its files ---------------------
"$bin/python" - "$wheel" <<'EOF' || fail "the installed package (above)"
import importlib.metadata
import sys
import zipfile

import app_toolkit

assert app_toolkit.__file__.startswith(sys.prefix), f"imported from {app_toolkit.__file__}, not the venv"
version = importlib.metadata.version("app_toolkit")
assert app_toolkit.__version__ == version, f"__version__ {app_toolkit.__version__} != metadata {version}"
names = zipfile.ZipFile(sys.argv[1]).namelist()
for needed in (
    "app_toolkit/templates/service/cookiecutter.json",
    "app_toolkit/templates/chat/cookiecutter.json",
    "app_toolkit/_runtime/front/dashboard_files/index.html",
):
    assert needed in names, f"the wheel has no {needed}"
# Bytecode in a template would be copied into every baked project.
stray = [name for name in names if name.endswith((".pyc", ".pyo")) or "__pycache__" in name]
assert not stray, f"bytecode in the wheel (remove the __pycache__ folders, then build): {stray[:3]}"
print(f"ok   version                {version}: __version__, the metadata; {len(names)} files, no bytecode")
EOF
[ "$("$bin/app-toolkit" --version)" = "app-toolkit, version $("$bin/python" -c 'import app_toolkit; print(app_toolkit.__version__)')" ] ||
    fail "app-toolkit --version says $("$bin/app-toolkit" --version)"

# What `import app_toolkit` must leave for the code that needs them (import them there).
"$bin/python" -X importtime -c 'import app_toolkit' 2>"$work/importtime.txt"
heavy=$(awk -F'|' 'NR > 1 { gsub(/ /, "", $3); print $3 }' "$work/importtime.txt" |
    grep -E '^(cookiecutter|fastapi_offline|torch|transformers)(\.|$)' || true)
[ -z "$heavy" ] || fail "import app_toolkit imports $(echo "$heavy" | head -n 5 | tr '\n' ' ')"
ok importtime "$(tail -n 1 "$work/importtime.txt" | awk -F'|' '{ printf "%.0f ms", $2 / 1000 }'), no cookiecutter, fastapi_offline, torch or transformers"

# --- app-toolkit new: both templates ----------------------------------------------------
for template in service chat; do
    timeout 120 "$bin/app-toolkit" new "$template" -o "$work/projects" --no-input "project_name=Wheel $template" \
        >"$work/new-$template.log" 2>&1 || { show "$work/new-$template.log"; fail "app-toolkit new $template"; }
    project=$work/projects/wheel-$template
    for file in README.md Makefile pyproject.toml Dockerfile .dockerignore .gitignore .github/workflows/ci.yml \
        "wheel_$template/app.py" tests/conftest.py; do
        [ -f "$project/$file" ] || fail "app-toolkit new $template made no $file"
    done
    # The project's Makefile installs app_toolkit from this wheel, as long as it exists.
    planned=$(make -n --no-print-directory -C "$project" test)
    grep -qF "pip install --quiet \"$wheel\"" <<<"$planned" || fail "wheel-$template/Makefile does not install $wheel"
    ok "new $template" "$(find "$project" -type f | wc -l) files; its Makefile installs this wheel"
done

# --- app-toolkit run: an app file of our own, on 127.0.0.1 -----------------------------
mkdir "$work/app"
cat >"$work/app/hello.py" <<'EOF'
from fastapi import FastAPI

app = FastAPI()


@app.get("/hello/{name}")
async def hello(name: str) -> dict[str, str]:
    return {"message": f"Hello, {name}!"}
EOF
# A free port below Linux's ephemeral ones and above Ray's worker ports.
port=$("$bin/python" -c '
import random, socket
for port in random.sample(range(20000, 32000), 100):
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(port)
        break')
start=$SECONDS
# In a session of its own: if a check fails, cleanup stops Ray's processes with it.
(cd "$work/app" && exec setsid "$bin/app-toolkit" run hello:app --host 127.0.0.1 --port "$port") \
    >"$work/serve.log" 2>&1 &
server=$!
"$bin/python" - "$port" "$server" <<'EOF' || { show "$work/serve.log"; fail "app-toolkit run hello:app"; }
import json
import os
import sys
import time
import urllib.error
import urllib.request

port, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 180  # a cold start takes 5-10 s; a loaded 2-core host more
while True:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello/wheel", timeout=10) as answer:
            body = json.load(answer)
        break
    except (urllib.error.URLError, ConnectionError):  # not listening, or not serving the app yet
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            sys.exit("app-toolkit run exited before it answered")
        if time.monotonic() > deadline:
            sys.exit("no answer within 180 s")
        time.sleep(0.25)  # polling the condition, with the deadline above
assert body == {"message": "Hello, wheel!"}, body
# The files the wheel carries for pages: the dashboard's (package data), /docs' (fastapi-offline).
for path, expected in (
    ("/-/dashboard", b"<title>app_toolkit dashboard</title>"),
    ("/-/dashboard/dashboard.js", b"EventSource"),
    ("/docs", b"/docs/assets/swagger-ui-bundle.js"),
    ("/docs/assets/swagger-ui-bundle.js", b"SwaggerUI"),
):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        assert answer.status == 200 and expected in answer.read(), f"GET {path}: {answer.status}"
EOF
answered=$((SECONDS - start))
kill -TERM "$server"
for _ in $(seq 240); do # 60 s for Ray to stop
    kill -0 "$server" 2>/dev/null || break
    sleep 0.25
done
kill -0 "$server" 2>/dev/null && { show "$work/serve.log"; fail "app-toolkit run still running 60 s after SIGTERM"; }
status=0
wait "$server" || status=$?
[ "$status" -eq 0 ] && grep -q "app-toolkit: stopped" "$work/serve.log" ||
    { show "$work/serve.log"; fail "app-toolkit run stopped with status $status"; }
left=$(pgrep -g "$server" | wc -l || true)
[ "$left" -eq 0 ] || fail "$left processes of app-toolkit run's session left after it stopped"
server=""
ok "run" "200 from 127.0.0.1:$port ${answered} s after start (the app, /-/dashboard, /docs); SIGTERM stopped it and its Ray"

# --- the baked projects' own tests (make test, in this venv) ----------------------------
for template in service chat; do
    project=$work/projects/wheel-$template
    start=$SECONDS
    timeout 600 "$bin/pip" install --quiet -e "$project[test]" >"$work/install-$template.log" 2>&1 ||
        { show "$work/install-$template.log"; fail "pip install -e wheel-$template[test]"; }
    touch "$venv/.installed" # what the Makefile's own install step leaves: it is done
    timeout 900 make --no-print-directory -C "$project" test VENV="$venv" >"$work/test-$template.log" 2>&1 ||
        { show "$work/test-$template.log" 60; fail "make test in wheel-$template"; }
    summary=$(grep -E '^=+ .* in [0-9.]+s' "$work/test-$template.log" | tail -n 1 || true)
    case $summary in
    *skipped* | *failed* | *error*) fail "make test in wheel-$template: $summary" ;;
    *" passed"*) ok "$template tests" "$(echo "$summary" | tr -d '=' | xargs), $((SECONDS - start)) s with its install" ;;
    *) fail "make test in wheel-$template: no pytest summary ($summary)" ;;
    esac
done

echo "wheel check passed in $((SECONDS - began)) s"
