#!/usr/bin/env bash
# count_tests LOG, sourced by scripts/test.sh; `bash scripts/count-tests.sh --self-test`
# checks it on a fixture (a clean binary, a crashed one, a failing one).
#
# "N passed, M failed, K ignored" summed over cargo / wasm-bindgen-test result lines
# ("test result: ok. N passed; M failed; ...") and plain "[word: ]N passed, M failed" lines.
# A test binary that crashed (SIGSEGV, abort, a panic in the harness) prints "running N
# tests" and never its "test result:" line: its tests that did not report ok/ignored
# count as failed, and the binary is named a crash.
count_tests() {
  awk '
    function tally(line,   i, w) {
      w = split(line, a, /[ ;,.]+/)
      for (i = 1; i < w; i++) {
        if (a[i+1] ~ /^passed/) p += a[i]
        if (a[i+1] ~ /^failed/) f += a[i]
        if (a[i+1] ~ /^ignored/) g += a[i]
      }
      n++
    }
    function crash() {
      if (open) { p += ok; g += ig; f += run - ok - ig; crashed++; n++ }
      open = 0
    }
    /^running [0-9]+ tests?$/ { crash(); open = 1; run = $2; ok = 0; ig = 0; next }
    open && /^test .* \.\.\. ok$/ { ok++; next }
    open && /^test .* \.\.\. ignored/ { ig++; next }
    /^test result: / { open = 0; tally($0); next }
    /^([A-Za-z0-9_. -]+: )?[0-9]+ passed, [0-9]+ failed/ { tally($0); next }
    END {
      crash()
      if (n) printf "%d passed, %d failed, %d ignored", p, f, g
      if (crashed) printf " (%d test binaries crashed)", crashed
    }' "$1" 2>/dev/null || true
}

if [ "${BASH_SOURCE[0]}" = "$0" ] && [ "${1:-}" = "--self-test" ]; then
  fixture="$(mktemp)"
  trap 'rm -f "$fixture"' EXIT
  cat >"$fixture" <<'LOG'
running 3 tests
test a ... ok
test b ... ok
test c ... ok

test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s

running 5 tests
test x ... ok
test y ... ignored
error: test failed, to rerun pass `--lib`
  process didn't exit successfully: (signal: 11, SIGSEGV: invalid memory reference)
running 2 tests
test q ... FAILED
test r ... ok

test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s
LOG
  got="$(count_tests "$fixture")"
  want="5 passed, 4 failed, 1 ignored (1 test binaries crashed)"
  if [ "$got" = "$want" ]; then
    echo "count_tests: 1 passed, 0 failed"
  else
    echo "count_tests: got '$got', want '$want'"
    echo "count_tests: 0 passed, 1 failed"
    exit 1
  fi
fi
