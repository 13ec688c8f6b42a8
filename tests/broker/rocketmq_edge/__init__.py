"""The broker's RocketMQ edge (broker/edge/rocketmq/) against a real in-process cluster, over RocketMQ's
remoting with our codecs: transactions, message queries, mqadmin's admin and statistics codes."""
