# Sourced by the example checks: `expect WANT TEXT ARGS...` runs "$bin" ARGS and fails the script
# unless it exits WANT with TEXT in its stderr; it prints the first line of stderr. Sets $out and
# $err (the run's stdout and stderr files, removed on exit).
out="$(mktemp)" err="$(mktemp)"
trap 'rm -f "$out" "$err"' EXIT
expect() {
    local want=$1 text=$2; shift 2
    set +e; "$bin" "$@" >"$out" 2>"$err"; local got=$?; set -e
    if [[ $got != "$want" ]] || ! grep -qF -- "$text" "$err"; then
        echo "$(basename "$0"): \`$(basename "$bin") $*\` exited $got (want $want), stdout and stderr:" >&2
        cat "$out" "$err" >&2
        exit 1
    fi
    echo "$(basename "$0"): $(basename "$bin") $*: exit $got, \"$(head -1 "$err")\""
}
