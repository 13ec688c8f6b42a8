"""Accounts and ACL files for tests (one place, so every suite uses the same shapes)."""

from __future__ import annotations

import os
from typing import Any

import yaml

from broker.protocol.auth import Credentials

ADMIN = Credentials("admin", "admin-secret-0001")
BROKER_G0 = Credentials("RaftNode00-broker", "broker-secret-g0")
BROKER_G1 = Credentials("RaftNode01-broker", "broker-secret-g1")
PRODUCER = Credentials("producer", "producer-secret-1")  # PUB on every topic, nothing else
CONSUMER = Credentials("consumer", "consumer-secret-1")  # SUB on topics and groups
TRACER = Credentials("tracer", "tracer-secret-01")  # a consumer's: SUB, and PUB on the trace topic
NOBODY = Credentials("nobody", "nobody-secret-01")  # DENY everything
STRANGER = Credentials("stranger", "not-in-the-file-1")  # not an account at all


def acl_doc(*extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "accounts": [
            {"accessKey": ADMIN.access_key, "secretKey": ADMIN.secret_key, "admin": True},
            {"accessKey": BROKER_G0.access_key, "secretKey": BROKER_G0.secret_key, "brokerNames": ["RaftNode00"]},
            {"accessKey": BROKER_G1.access_key, "secretKey": BROKER_G1.secret_key, "brokerNames": ["RaftNode01"]},
            {"accessKey": PRODUCER.access_key, "secretKey": PRODUCER.secret_key, "defaultTopicPerm": "PUB",
             "defaultGroupPerm": "PUB"},
            {"accessKey": CONSUMER.access_key, "secretKey": CONSUMER.secret_key, "defaultTopicPerm": "SUB",
             "defaultGroupPerm": "SUB"},
            {"accessKey": TRACER.access_key, "secretKey": TRACER.secret_key, "defaultTopicPerm": "SUB",
             "defaultGroupPerm": "SUB", "topicPerms": ["RMQ_SYS_TRACE_TOPIC=PUB|SUB"]},
            {"accessKey": NOBODY.access_key, "secretKey": NOBODY.secret_key, "defaultTopicPerm": "DENY",
             "defaultGroupPerm": "DENY"},
            *extra,
        ]
    }


def write_acl(path: str, doc: dict[str, Any] | None = None) -> str:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump(doc if doc is not None else acl_doc(), f, sort_keys=False)
    os.replace(tmp, path)  # a reader never sees half a file
    return path
