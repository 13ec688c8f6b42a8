"""``dledger-dashboard``: a web dashboard over a cluster (RocketMQ's rocketmq-dashboard), see
``broker/tools/dashboard/server.py`` and docs/OPERATIONS.md."""
