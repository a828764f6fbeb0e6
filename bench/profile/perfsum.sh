#!/bin/bash
# perfsum.sh CPU.data : daemon samples by thread, by symbol (threads merged), top comm,symbol
D=$1
echo "== by thread"; perf report -i $D --no-children --sort comm --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -14
echo "== by symbol (all threads)"; perf report -i $D --no-children --sort dso,symbol --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -${2:-16}
echo "== by comm,symbol"; perf report -i $D --no-children --sort comm,symbol --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -14
echo "== samples"; perf report -i $D --stdio --no-children --sort comm -g none 2>/dev/null | grep -m1 "Samples"
