# Sourced by scripts/compat_*.sh: one virtualenv per release of one package, the given tests in
# each, a pass/fail table. The caller sets:
#   kind       the package's name, for people ("torch")
#   prefix     the virtualenvs' and logs' name prefix ("torch" -> $root/torch-<version>)
#   versions   the releases (array), tests (array), deps (array: installed beside the release)
#   specs()    prints the pip requirements that differ per release, given the version
#   probe      Python code printing what got installed
#   pytest_env VAR=value words put in pytest's environment (may be empty)
#   python_for (optional function) the interpreter for a version, else $python for every one
# and root, here, python. Exits with 1 when any release failed.

rows=()
failed=0
mkdir -p "$root"
for version in "${versions[@]}"; do
    venv="$root/$prefix-$version"
    log="$root/$prefix-$version.log"
    read -r -a pins <<<"$(specs "$version")"
    py="$python"
    if declare -F python_for >/dev/null && ! py="$(python_for "$version")"; then
        rows+=("$version|no interpreter|-|-")
        failed=1
        continue
    fi
    want="${pins[*]} ${deps[*]} $py"
    install="ok"
    if [ "$(cat "$venv/.compat-spec" 2>/dev/null)" != "$want" ]; then
        echo "== $kind $version: building $venv (log: $log)"
        rm -rf "$venv"
        if "$py" -m venv "$venv" >"$log" 2>&1 \
            && "$venv/bin/pip" install -q "${pins[@]}" "${deps[@]}" >>"$log" 2>&1 \
            && "$venv/bin/pip" install -q --no-deps -e "$here" >>"$log" 2>&1; then
            echo "$want" >"$venv/.compat-spec"
        else
            install="FAILED"
        fi
    else
        : >"$log"
    fi
    if [ "$install" != "ok" ]; then
        rows+=("$version|install failed|-|see $log")
        failed=1
        continue
    fi
    echo "== $kind $version: running tests"
    # shellcheck disable=SC2086  # pytest_env and PYTEST_ARGS are split on purpose
    (cd "$here" && env ${pytest_env:-} "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        "${tests[@]}" ${PYTEST_ARGS:-}) >>"$log" 2>&1
    rc=$?
    summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1 | tr -d '=')"
    actual="$("$venv/bin/python" -c "$probe" 2>/dev/null)"
    if [ "$rc" -eq 0 ]; then result="PASS"; else result="FAIL (rc $rc)"; failed=1; fi
    rows+=("$version|$result|${actual:-?}|${summary:-no summary, see $log}")
done

echo
printf '%-12s %-14s %-28s %s\n' "$kind" "result" "installed" "pytest"
for row in "${rows[@]}"; do
    IFS='|' read -r v r a s <<<"$row"
    printf '%-12s %-14s %-28s %s\n' "$v" "$r" "$a" "$s"
done
for version in "${versions[@]}"; do
    grep -E '^(FAILED|ERROR) ' "$root/$prefix-$version.log" 2>/dev/null | sed -e 's/ - .*//' \
        -e "s/^/  $version  /"
done
echo "logs: $root/$prefix-<version>.log"
exit "$failed"
