#!/usr/bin/env bash
# Regenerates rmq4.json and rmq5.json: the test vectors of broker/protocol/rocketmq made by the
# official RocketMQ 4.9.8 and 5.3.1 classes (see README.md). Needs Java 8+ and Maven (Maven
# Central); the Python tests do not.
#
#   bash tests/wire/vectors/regen.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# 5.x moved the protocol classes from rocketmq-common to rocketmq-remoting: the same generator,
# with its imports renamed.
to_5x() {
    sed -e 's/org\.apache\.rocketmq\.common\.admin\./org.apache.rocketmq.remoting.protocol.admin./' \
        -e 's/org\.apache\.rocketmq\.common\.subscription\./org.apache.rocketmq.remoting.protocol.subscription./' \
        -e 's/org\.apache\.rocketmq\.common\.DataVersion/org.apache.rocketmq.remoting.protocol.DataVersion/' \
        -e 's/org\.apache\.rocketmq\.common\.protocol\./org.apache.rocketmq.remoting.protocol./' \
        -e 's/org\.apache\.rocketmq\.common\.filter\.FilterAPI/org.apache.rocketmq.remoting.protocol.filter.FilterAPI/' \
        "$1"
}

for version in 4.9.8 5.3.1; do
    out="rmq${version%%.*}.json"
    dir="$WORK/$version"
    mkdir -p "$dir/src" "$dir/classes"
    mvn -q -f "$HERE/pom.xml" -Drocketmq.version="$version" dependency:build-classpath \
        -Dmdep.outputFile="$dir/cp.txt" >&2
    if [ "$version" = 4.9.8 ]; then
        cp "$HERE/src/main/java/vectors/Gen.java" "$dir/src/Gen.java"
    else
        to_5x "$HERE/src/main/java/vectors/Gen.java" > "$dir/src/Gen.java"
    fi
    CP="$(cat "$dir/cp.txt")"
    javac -encoding UTF-8 -nowarn -cp "$CP" -d "$dir/classes" "$dir/src/Gen.java"
    java -Dfile.encoding=UTF-8 -cp "$dir/classes:$CP" vectors.Gen > "$dir/$out"
    mv "$dir/$out" "$HERE/$out"
    echo "wrote $HERE/$out" >&2
done
