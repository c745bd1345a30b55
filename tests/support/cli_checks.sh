# Checks shared by the shell tests of the kvrail commands and the plot scripts. Source it.
#
#   expect NAME COMMAND...   runs COMMAND; when it fails, prints "FAIL NAME" and sets fail=1
#                            (the test ends with `exit $fail`), so that one run lists every
#                            broken check.
#   refused MESSAGE TEXT     the caller's `plot` function must refuse TEXT (written to
#                            $dir/bad.json and plotted to $dir/bad.png) with MESSAGE on
#                            stderr, and write no image; otherwise exits 1.
fail=0

expect() {
  local name=$1
  shift
  if ! "$@"; then echo "FAIL $name"; fail=1; fi
}

refused() {
  printf '%s' "$2" >"$dir/bad.json"
  if plot "$dir/bad.json" -o "$dir/bad.png" 2>"$dir/err"; then
    echo "accepted: $2"
    exit 1
  fi
  grep -qF "$1" "$dir/err" || { echo "expected '$1', got: $(cat "$dir/err")"; exit 1; }
  [[ ! -e "$dir/bad.png" ]] || { echo "wrote an image for: $2"; exit 1; }
}
