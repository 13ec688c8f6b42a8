"""``mqadmin queryTransactionHalf`` (broker/tools/mqadmin_txn.py) on the in-process cluster: pending halves
are listed per group until they are resolved; bad flags exit 2."""

from __future__ import annotations

from broker.client import LocalTransactionState, Message, MessageExt, TransactionProducer
from tests.acl_fixtures import PRODUCER
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.broker.tools.conftest import Mqadmin

CLUSTER = "DefaultCluster"


class Undecided:
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState(arg)

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW


async def test_query_transaction_half_lists_pending_halves(cluster: InProcBrokerCluster, mqadmin: Mqadmin) -> None:
    await cluster.create_topic("T", 2)
    async with TransactionProducer("txn-pg", cluster.namesrv_addr, Undecided(), credentials=PRODUCER) as p:
        pending = await p.send_message_in_transaction(Message("T", b"undecided"), "UNKNOW")
        await p.send_message_in_transaction(Message("T", b"done"), "COMMIT_MESSAGE")
    run = await mqadmin("queryTransactionHalf", "-c", CLUSTER, "--json")
    assert run.rc == 0, run.err
    brokers = run.json()["brokers"]
    assert len(brokers) == len(cluster.groups) and sum(b["pending"] for b in brokers) == 1
    (half,) = [h for b in brokers for h in b["halves"]]
    assert (half["msg_id"], half["topic"], half["producer_group"], half["check_times"]) == (
        pending.msg_id, "T", "txn-pg", 0)
    name = pending.send_result.message_queue.broker_name
    run = await mqadmin("queryTransactionHalf", "-b", cluster.group(name).replicas[0].addr, "-g", "other")
    assert run.rc == 0 and pending.msg_id not in run.out and f"{name}: 1" in run.out
    run = await mqadmin("queryTransactionHalf", "-c", CLUSTER)
    assert run.rc == 0 and pending.msg_id in run.out
    assert (await mqadmin("queryTransactionHalf", "-c", CLUSTER, "-m", "0")).rc == 2
    assert (await mqadmin("queryTransactionHalf")).rc == 2
