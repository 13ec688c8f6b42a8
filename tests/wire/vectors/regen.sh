#!/usr/bin/env bash
# Regenerates rmq4.json: the test vectors of broker/protocol/rocketmq made by the official RocketMQ
# 4.9.8 classes (see README.md). Needs Java 8+ and Maven (Maven Central); the Python tests do not.
#
#   bash tests/wire/vectors/regen.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mvn -q -f "$HERE/pom.xml" dependency:build-classpath -Dmdep.outputFile="$WORK/cp.txt" >&2
CP="$(cat "$WORK/cp.txt")"
javac -encoding UTF-8 -nowarn -cp "$CP" -d "$WORK/classes" "$HERE/src/main/java/vectors/Gen.java"
java -Dfile.encoding=UTF-8 -cp "$WORK/classes:$CP" vectors.Gen > "$WORK/rmq4.json"
mv "$WORK/rmq4.json" "$HERE/rmq4.json"
echo "wrote $HERE/rmq4.json" >&2
