"""``mqadmin``'s command table: every command's name, help and arguments, and the function that runs
it, named ``"module:function"`` (a module of ``broker.tools``). Only the chosen command's module is
imported (``runner``), so a simple command starts without the SDK's producer and consumer code, the
SQL92 compiler or aiohttp (issue 28: ``mqadmin clusterList`` used ~0.75 s of CPU importing them)."""

from __future__ import annotations

import argparse
import importlib
from typing import TYPE_CHECKING

from broker.client.transport import add_security_arguments
from broker.tools.cli import add_namesrv_argument
from broker.tools.mqadmin_format import non_negative_int, parse_bool, parse_timestamp, positive_float

if TYPE_CHECKING:
    from broker.tools.mqadmin_format import Runner

PROG = "mqadmin"


def runner(spec: str) -> Runner:
    """The function a ``"module:function"`` spec names (``broker.tools.<module>``), imported now."""
    module, _, name = spec.partition(":")
    fn: Runner = getattr(importlib.import_module(f"broker.tools.{module}"), name)
    return fn


def _common(p: argparse.ArgumentParser) -> None:
    add_namesrv_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.add_argument("--timeout", type=positive_float, default=3.0, help="seconds per request (default 3)")
    add_security_arguments(p)


def _target(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-c", "--clusterName", dest="cluster", help="every group leader of this cluster")
    g.add_argument("-b", "--brokerAddr", dest="broker_addr", help="this one broker (host:port)")


def _either_target(p: argparse.ArgumentParser) -> None:
    """-c or -b, checked by the command (some commands also take neither)."""
    p.add_argument("-c", "--clusterName", dest="cluster", default=None, help="every group of this cluster")
    p.add_argument("-b", "--brokerAddr", dest="broker_addr", default=None, help="this one broker (host:port)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Admin tool of the DLedger-mode message cluster (RocketMQ's mqadmin).",
        epilog="Exit codes: 0 ok, 1 the cluster answered an error or is unreachable, 2 bad usage or input.",
    )
    parser.add_argument(
        "-n",
        "--namesrvAddr",
        dest="namesrv_first",
        default=None,
        help="NameServer list, as after the command (RocketMQ users type it first: mqadmin -n ADDR clusterList)",
    )
    parser.add_argument(
        "--json",
        dest="json_first",
        action="store_true",
        help="print one JSON document instead of a table (also accepted after the command)",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")

    def cmd(name: str, help_text: str, runner: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p)
        p.set_defaults(runner=runner)
        return p

    cmd(
        "clusterList",
        "List the broker groups of every cluster, one row per replica",
        "mqadmin_cluster:run_cluster_list",
    )
    cmd("topicList", "List every topic the NameServer knows", "mqadmin_cluster:run_topic_list")
    p = cmd("topicRoute", "Show a topic's queues and broker groups", "mqadmin_cluster:run_topic_route")
    p.add_argument("-t", "--topic", required=True)
    p = cmd("updateTopic", "Create or update a topic", "mqadmin_cluster:run_update_topic")
    p.add_argument("-t", "--topic", required=True)
    _target(p)
    p.add_argument("-r", "--readQueueNums", dest="read_queue_nums", type=int, default=4)
    p.add_argument("-w", "--writeQueueNums", dest="write_queue_nums", type=int, default=4)
    p.add_argument("-p", "--perm", type=int, default=6, help="4 read | 2 write (default 6)")
    p.add_argument("-o", "--order", type=parse_bool, nargs="?", const=True, default=False)
    p = cmd(
        "deleteTopic",
        "Delete a topic from a cluster's brokers, then from every NameServer",
        "mqadmin_cluster:run_delete_topic",
    )
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-c", "--clusterName", dest="cluster", required=True)
    p = cmd(
        "topicStatus",
        "Min/max offset and last store time of every queue of a topic",
        "mqadmin_cluster:run_topic_status",
    )
    p.add_argument("-t", "--topic", required=True)
    p = cmd("updateSubGroup", "Create or update a subscription group", "mqadmin_cluster:run_update_sub_group")
    p.add_argument("-g", "--groupName", dest="group", required=True)
    _target(p)
    p.add_argument("-s", "--consumeEnable", dest="consume_enable", type=parse_bool, default=True)
    p.add_argument(
        "-d", "--consumeBroadcastEnable", dest="consume_broadcast_enable", type=parse_bool, default=True
    )
    p.add_argument("-r", "--retryMaxTimes", dest="retry_max_times", type=int, default=16)
    p = cmd(
        "consumerProgress",
        "A consumer group's offsets and lag per queue",
        "mqadmin_cluster:run_consumer_progress",
    )
    p.add_argument("-g", "--groupName", dest="group", required=True)
    p.add_argument("-t", "--topic", default=None)
    p = cmd("brokerStatus", "A broker's own status", "mqadmin_cluster:run_broker_status")
    p.add_argument("-b", "--brokerAddr", dest="broker_addr", required=True)
    p = cmd(
        "queryMsgById",
        "A message by its msgId (<brokerName>:<position>)",
        "mqadmin_messages:run_query_msg_by_id",
    )
    p.add_argument("-i", "--msgId", dest="msg_id", required=True)
    p = cmd(
        "queryMsgTraceById",
        "A message's trace: its send, then each group's consumption",
        "mqadmin_messages:run_query_msg_trace_by_id",
    )
    p.add_argument("-i", "--msgId", dest="msg_id", required=True, help="the msgId or the unique id")
    p.add_argument(
        "-t",
        "--traceTopic",
        dest="trace_topic",
        default=None,
        help="trace topic (default RMQ_SYS_TRACE_TOPIC)",
    )
    p = cmd(
        "queryMsgByKey",
        "Messages of a topic carrying a key, newest first",
        "mqadmin_messages:run_query_msg_by_key",
    )
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-k", "--msgKey", dest="key", required=True)
    p.add_argument("-c", "--maxNum", dest="max", type=int, default=64)
    p = cmd(
        "queryMsgByUniqueKey",
        "Messages by the producer's unique key",
        "mqadmin_messages:run_query_msg_by_unique_key",
    )
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-u", "--uniqueKey", dest="unique_key", required=True)
    p = cmd("queryMsgByOffset", "The message at a queue offset", "mqadmin_messages:run_query_msg_by_offset")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-m", "--brokerName", dest="broker_name", required=True)
    p.add_argument("-q", "--queueId", dest="queue_id", type=non_negative_int, required=True)
    p.add_argument("-o", "--offset", type=non_negative_int, required=True)
    p = cmd(
        "queryDlqMessageByConsumerGroup",
        "The newest messages of a group's dead-letter queue",
        "mqadmin_messages:run_query_dlq_messages",
    )
    p.add_argument("-g", "--consumerGroup", dest="group", required=True)
    p.add_argument("-c", "--maxNum", dest="max", type=int, default=64, help="per queue (default 64)")
    p = cmd(
        "resendDlqMessage",
        "Send a dead-letter message back to its group's retry topic",
        "mqadmin_messages:run_resend_dlq_message",
    )
    p.add_argument("-g", "--consumerGroup", dest="group", required=True)
    p.add_argument("-i", "--msgId", dest="msg_id", required=True)
    p = cmd("sendMessage", "Send one message", "mqadmin_messages:run_send_message")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-p", "--body", required=True, help="the body, as UTF-8 text")
    p.add_argument("-k", "--keys", default=None, help="space-separated keys")
    p.add_argument("-c", "--tags", default=None)
    p.add_argument("-m", "--brokerName", dest="broker_name", default=None)
    p.add_argument("-q", "--queueId", dest="queue_id", type=non_negative_int, default=None)
    p = cmd(
        "consumeMessage",
        "Print messages of a topic (reads only: commits nothing)",
        "mqadmin_messages:run_consume_message",
    )
    p.add_argument("-t", "--topic", required=True)
    p.add_argument(
        "--sql", default=None, help="only messages matching this SQL92 condition (filtered by the broker)"
    )
    p.add_argument("-g", "--consumerGroup", dest="group", default=None)
    p.add_argument(
        "-c", "--count", dest="count", type=int, default=128, help="at most this many (default 128)"
    )
    p.add_argument("-m", "--brokerName", dest="broker_name", default=None)
    p.add_argument("-q", "--queueId", dest="queue_id", type=non_negative_int, default=None)
    p.add_argument(
        "-s",
        "--startOffset",
        dest="start_offset",
        type=non_negative_int,
        default=None,
        help="first queue offset (default: each queue's first)",
    )
    p.add_argument(
        "-e",
        "--endOffset",
        dest="end_offset",
        type=non_negative_int,
        default=None,
        help="stop before this queue offset (default: each queue's max when started)",
    )
    p = cmd(
        "resetOffsetByTime",
        "Move a group's offsets of a topic to a time (backwards too)",
        "mqadmin_cluster:run_reset_offset_by_time",
    )
    p.add_argument("-g", "--groupName", dest="group", required=True)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument(
        "-s",
        "--timestamp",
        type=parse_timestamp,
        required=True,
        help="now, epoch ms, or yyyy-MM-dd#HH:mm:ss:SSS",
    )
    p = cmd(
        "transferLeader",
        "Hand a broker group's leadership to another replica",
        "mqadmin_cluster:run_transfer_leader",
    )
    p.add_argument("-m", "--brokerName", dest="broker_name", required=True)
    p.add_argument("-i", "--targetId", dest="target_id", default=None, help="peer id, e.g. n1 (default: any)")
    # issue 27: a group's Raft membership (one server at a time, through the log)
    p = cmd(
        "getReplicas",
        "A broker group's members: role (voter, learner), Raft address, match index and lag",
        "mqadmin_membership:run_get_replicas",
    )
    p.add_argument("-m", "--brokerName", dest="broker_name", required=True)
    p = cmd(
        "addLearner",
        "Add a new replica to a broker group as a learner (receives the log, counts for nothing)",
        "mqadmin_membership:run_add_learner",
    )
    p.add_argument("-m", "--brokerName", dest="broker_name", required=True)
    p.add_argument("-i", "--id", required=True, help="the new replica's peer id (dLegerSelfId), e.g. n3")
    p.add_argument("-a", "--address", required=True, help="its Raft address host:port (its dLegerPeers entry)")
    p = cmd(
        "promoteLearner",
        "Make a caught-up learner a voter (waits up to --wait seconds for it to catch up)",
        "mqadmin_membership:run_promote_learner",
    )
    p.add_argument("-m", "--brokerName", dest="broker_name", required=True)
    p.add_argument("-i", "--id", required=True)
    p.add_argument("--wait", type=positive_float, default=60.0, help="seconds to wait for catch-up (default 60)")
    p = cmd(
        "removeReplica",
        "Remove a replica (voter or learner) from a broker group; not its leader",
        "mqadmin_membership:run_remove_replica",
    )
    p.add_argument("-m", "--brokerName", dest="broker_name", required=True)
    p.add_argument("-i", "--id", required=True)
    p = cmd(
        "replaceReplica",
        "Swap a caught-up learner (--new) for a replica (--old): promote, then remove",
        "mqadmin_membership:run_replace_replica",
    )
    p.add_argument("-m", "--brokerName", dest="broker_name", required=True)
    p.add_argument("--old", required=True, help="the replica to remove (e.g. a dead one)")
    p.add_argument("--new", required=True, help="the learner that replaces it")
    p.add_argument("--wait", type=positive_float, default=60.0, help="seconds to wait for catch-up (default 60)")
    # parity with RocketMQ (issue 16)
    p = cmd(
        "deleteSubGroup",
        "Delete a subscription group (and its offsets) from brokers",
        "mqadmin_ops:run_delete_sub_group",
    )
    p.add_argument("-g", "--groupName", dest="group", required=True)
    _either_target(p)
    p = cmd(
        "consumerConnection",
        "The consumers of a group online at the brokers",
        "mqadmin_ops:run_consumer_connection",
    )
    p.add_argument("-g", "--consumerGroup", dest="group", required=True)
    p = cmd(
        "producerConnection",
        "The producers of a group seen sending lately, per broker replica",
        "mqadmin_ops:run_producer_connection",
    )
    p.add_argument("-g", "--producerGroup", dest="group", required=True)
    p.add_argument("-t", "--topic", default=None)
    p = cmd("topicClusterList", "The clusters serving a topic", "mqadmin_ops:run_topic_cluster_list")
    p.add_argument("-t", "--topic", required=True)
    p = cmd(
        "allocateMQ",
        "How the averagely strategy splits a topic's queues among clients",
        "mqadmin_ops:run_allocate_mq",
    )
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-i", "--ipList", dest="ip_list", required=True, help="client ids, comma-separated")
    p = cmd(
        "wipeWritePerm",
        "Route a broker group read-only at every NameServer (drain it)",
        "mqadmin_ops:run_wipe_write_perm",
    )
    p.add_argument("-b", "--brokerName", dest="broker_name", required=True)
    p = cmd(
        "addWritePerm",
        "Give a broker group's routes their write permission back",
        "mqadmin_ops:run_add_write_perm",
    )
    p.add_argument("-b", "--brokerName", dest="broker_name", required=True)
    cmd("getNamesrvConfig", "Every NameServer's configuration", "mqadmin_ops:run_get_namesrv_config")
    p = cmd(
        "updateNamesrvConfig",
        "Change a hot config key on every NameServer (until restart)",
        "mqadmin_ops:run_update_namesrv_config",
    )
    p.add_argument("-k", "--key", required=True, help="scanNotActiveBrokerInterval, brokerChannelMaxIdleTime")
    p.add_argument("-v", "--value", required=True)
    p = cmd(
        "getBrokerConfig", "A broker's configuration (secrets left out)", "mqadmin_ops:run_get_broker_config"
    )
    _either_target(p)
    p = cmd(
        "updateBrokerConfig",
        "Change a hot config key on running replicas (until restart)",
        "mqadmin_ops:run_update_broker_config",
    )
    _either_target(p)
    p.add_argument(
        "-k", "--key", required=True, help="autoCreateTopicEnable, defaultTopicQueueNums, longPollingMaxMs"
    )
    p.add_argument("-v", "--value", required=True)
    p = cmd(
        "cleanExpiredCQ",
        "Remove the consume queues of topics that no longer exist, on every replica",
        "mqadmin_ops:run_clean_expired_cq",
    )
    _either_target(p)
    p = cmd(
        "refusedRecords",
        "Committed records the replicas refused to apply (the same on every replica)",
        "mqadmin_ops:run_refused_records",
    )
    _either_target(p)
    p = cmd(
        "statsAll",
        "Per topic and consumer group: lag and in/out TPS (last 10 s)",
        "mqadmin_stats:run_stats_all",
    )
    p.add_argument("-t", "--topic", default=None, help="only this topic")
    p = cmd(
        "clusterRT",
        "Send round trip to every broker group leader (writes test messages)",
        "mqadmin_stats:run_cluster_rt",
    )
    p.add_argument("-c", "--clusterName", dest="cluster", default=None)
    p.add_argument("-a", "--amount", type=int, default=10, help="messages per group (default 10)")
    p.add_argument("-s", "--size", type=non_negative_int, default=128, help="body bytes (default 128)")
    p.add_argument(
        "-t", "--topic", default="SELF_TEST_TOPIC", help="topic written to (default SELF_TEST_TOPIC)"
    )
    p = cmd(
        "printMsg",
        "Print the messages of a topic stored in a time range (reads only)",
        "mqadmin_ops:run_print_msg",
    )
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-s", "--subExpression", dest="sub_expression", default="*", help="tags: '*' or 'a||b'")
    p.add_argument("-b", "--beginTimestamp", dest="begin", type=parse_timestamp, default=None)
    p.add_argument("-e", "--endTimestamp", dest="end", type=parse_timestamp, default=None)
    p.add_argument(
        "-c", "--count", dest="count", type=int, default=1024, help="at most this many (default 1024)"
    )
    p.add_argument("-d", "--printBody", dest="print_body", action="store_true", help="one line per message")
    p = cmd(
        "queryTransactionHalf",
        "Half messages of transactions still pending (oldest first)",
        "mqadmin_txn:run_query_transaction_half",
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-c", "--clusterName", dest="cluster", help="every group of this cluster")
    g.add_argument("-b", "--brokerAddr", dest="broker_addr", help="this one broker (host:port)")
    p.add_argument("-g", "--producerGroup", dest="group", default=None)
    p.add_argument("-t", "--topic", default=None)
    p.add_argument("-m", "--maxNum", dest="max", type=int, default=100, help="per group (default 100)")
    return parser
