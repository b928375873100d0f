#!/bin/sh
# One host command per TCP connection: reads a shell command line, runs it, sends its output and
# then "AGENT-RC=<exit status>" (conformance/interop/rxe.sh is the other end).
read -r line
sh -c "$line" 2>&1 </dev/null
echo "AGENT-RC=$?"
