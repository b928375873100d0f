#!/bin/sh
# retry-connect SECONDS CMD...: runs a client program until it gets past connecting to its server
# (the server may not listen yet; the programs exit at once when refused), then prints its output
# and exits with its status.
end=$(($(date +%s) + $1))
shift
out=/tmp/retry.$$
while :; do
  "$@" >"$out" 2>&1
  rc=$?
  grep -qiE "couldn't connect|connection refused|unable to connect" "$out" || break
  [ "$(date +%s)" -ge "$end" ] && break
  usleep 200000
done
cat "$out"
rm -f "$out"
exit $rc
