"""Access control, RocketMQ style: accounts from a ``plain_acl.yml`` file, permissions per topic and
group, admin-only operations; the file is reloaded when it changes.

The file (RocketMQ's ``plain_acl.yml`` shape; unknown keys are errors)::

    globalWhiteRemoteAddresses:        # optional: requests from these need no signature at all
      - 10.10.103.*                    # an IPv4 address, a CIDR (10.0.0.0/8) or a pattern with * parts
    accounts:
      - accessKey: RocketMQ
        secretKey: 12345678            # at least 8 characters
        admin: false
        defaultTopicPerm: DENY         # for topics not listed in topicPerms (DENY when absent)
        defaultGroupPerm: SUB          # for groups not listed in groupPerms (DENY when absent)
        topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
        groupPerms: [groupA=DENY, groupB=PUB|SUB, groupC=SUB]
      - accessKey: RaftNode00-broker   # a broker group's own account (our extension, see below)
        secretKey: ...
        brokerNames: [RaftNode00]

Permissions: ``DENY``, ``PUB``, ``SUB``, ``PUB|SUB`` (= ``ANY``). A topic named ``%RETRY%g`` or
``%DLQ%g`` is checked as group ``g``, as RocketMQ does. An ``admin`` account may do everything on
resources its lists do not name, and the admin operations (topic and group create/delete, offset
reset, leadership transfer, unregistering another principal's consumer, deleting a route at a
NameServer). ``brokerNames`` (not in RocketMQ) lists the broker groups an account may register,
unregister and claim leadership for at the NameServers.

Pure parts: ``parse_acl`` (text -> ``AclConfig``), ``decide``/``check`` (account, resources -> allowed?).
``AclWatcher`` is the thin I/O shell: it re-reads the file when its own (inode, mtime, size) or
content hash differ from the last read, never by comparing with a clock; a broken new file leaves
the previous rules in force (logged).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import hashlib
import ipaddress
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import yaml

from broker.protocol.auth import SECRET_CHARS_MIN, AuthError
from broker.protocol.names import ACCESS_KEY_RULE, is_access_key, is_name, is_stored_group, is_topic

log = logging.getLogger("broker.acl")

ACL_FILE_BYTES_MAX: Final = 4 << 20
ACCOUNTS_MAX: Final = 10_000
PERMS_PER_ACCOUNT_MAX: Final = 100_000
WHITE_ADDRESSES_MAX: Final = 1024
RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"
_ACCOUNT_KEYS: Final = frozenset(
    {"accessKey", "secretKey", "admin", "defaultTopicPerm", "defaultGroupPerm", "topicPerms", "groupPerms",
     "brokerNames"}
)
_TOP_KEYS: Final = frozenset({"globalWhiteRemoteAddresses", "accounts"})
_PATTERN_PART_RE: Final = re.compile(r"\*|[0-9]{1,3}")


class Perm(enum.IntFlag):
    DENY = 0
    PUB = 1
    SUB = 2
    ANY = 3


_PERM_NAMES: Final = {"DENY": Perm.DENY, "PUB": Perm.PUB, "SUB": Perm.SUB, "PUB|SUB": Perm.ANY,
                      "SUB|PUB": Perm.ANY, "ANY": Perm.ANY}


class AclError(ValueError):
    """The ACL file is unusable; the message names the file and the entry."""


@dataclasses.dataclass(frozen=True, slots=True)
class Account:
    access_key: str
    secret_key: str = dataclasses.field(repr=False)
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    topic_perms: Mapping[str, Perm] = dataclasses.field(default_factory=dict)
    group_perms: Mapping[str, Perm] = dataclasses.field(default_factory=dict)
    broker_names: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True, slots=True)
class AclConfig:
    accounts: Mapping[str, Account]
    white_networks: tuple[ipaddress.IPv4Network, ...] = ()
    white_patterns: tuple[tuple[str, ...], ...] = ()  # "10.10.*.*" as ("10", "10", "*", "*")
    digest: str = ""

    def secret_of(self, access_key: str) -> str | None:
        account = self.accounts.get(access_key)
        return None if account is None else account.secret_key

    def white_listed(self, remote: str | None) -> bool:
        if not remote or not (self.white_networks or self.white_patterns):
            return False
        try:
            ip = ipaddress.ip_address(remote)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if not isinstance(ip, ipaddress.IPv4Address):
            return False
        if any(ip in net for net in self.white_networks):
            return True
        parts = str(ip).split(".")
        return any(all(p == "*" or p == q for p, q in zip(pat, parts, strict=True)) for pat in self.white_patterns)


# -- parsing ---------------------------------------------------------------------------------------------
def _perm(value: Any, where: str) -> Perm:
    if not isinstance(value, str) or value.strip().upper() not in _PERM_NAMES:
        raise AclError(f"{where}: permission must be DENY, PUB, SUB or PUB|SUB, got {value!r:.60}")
    return _PERM_NAMES[value.strip().upper()]


def _perm_list(value: Any, where: str, valid_name: Any) -> dict[str, Perm]:
    if value is None:
        return {}
    if not isinstance(value, list) or len(value) > PERMS_PER_ACCOUNT_MAX:
        raise AclError(f"{where}: must be a list of name=PERM (at most {PERMS_PER_ACCOUNT_MAX})")
    out: dict[str, Perm] = {}
    for i, item in enumerate(value):
        name, sep, perm = item.partition("=") if isinstance(item, str) else ("", "", "")
        name = name.strip()
        if not sep or not valid_name(name):
            raise AclError(f"{where}[{i}]: expected name=PERM with a valid name, got {item!r:.80}")
        if name in out:
            raise AclError(f"{where}[{i}]: {name!r} is listed twice")
        out[name] = _perm(perm, f"{where}[{i}]")
    return out


def _account(raw: Any, where: str) -> Account:
    if not isinstance(raw, dict):
        raise AclError(f"{where}: must be a map")
    unknown = sorted(str(k) for k in raw if k not in _ACCOUNT_KEYS)
    if unknown:
        raise AclError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_ACCOUNT_KEYS))})")
    ak, sk = raw.get("accessKey"), raw.get("secretKey")
    if not isinstance(ak, str) or not is_access_key(ak):
        raise AclError(f"{where}.accessKey: must match {ACCESS_KEY_RULE}")
    if isinstance(sk, int) and not isinstance(sk, bool):
        sk = str(sk)  # RocketMQ's sample has secretKey: 12345678, which YAML reads as a number
    if not isinstance(sk, str) or len(sk) < SECRET_CHARS_MIN:
        raise AclError(f"{where}.secretKey: must be a string of at least {SECRET_CHARS_MIN} characters")
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        raise AclError(f"{where}.admin: must be true or false")
    brokers = raw.get("brokerNames") or []
    if not isinstance(brokers, list) or not all(is_name(b) for b in brokers):
        raise AclError(f"{where}.brokerNames: must be a list of broker names")
    return Account(
        access_key=ak,
        secret_key=sk,
        admin=admin,
        default_topic_perm=_perm(raw.get("defaultTopicPerm", "DENY"), f"{where}.defaultTopicPerm"),
        default_group_perm=_perm(raw.get("defaultGroupPerm", "DENY"), f"{where}.defaultGroupPerm"),
        topic_perms=_perm_list(raw.get("topicPerms"), f"{where}.topicPerms", is_topic),
        # the stored-group rule (up to 255 chars): ACL files written for older releases still load
        group_perms=_perm_list(raw.get("groupPerms"), f"{where}.groupPerms", is_stored_group),
        broker_names=frozenset(brokers),
    )


def _white(items: Any, source: str) -> tuple[tuple[ipaddress.IPv4Network, ...], tuple[tuple[str, ...], ...]]:
    if items is None:
        return (), ()
    if not isinstance(items, list) or len(items) > WHITE_ADDRESSES_MAX:
        raise AclError(f"{source}: globalWhiteRemoteAddresses must be a list (at most {WHITE_ADDRESSES_MAX})")
    nets, patterns = [], []
    for item in items:
        text = str(item).strip() if isinstance(item, (str, int)) else ""
        parts = text.split(".")
        if "*" in text:
            if len(parts) != 4 or not all(_PATTERN_PART_RE.fullmatch(p) for p in parts):
                raise AclError(f"{source}: white address {item!r:.60} must look like 10.10.*.*")
            patterns.append(tuple(parts))
            continue
        try:
            nets.append(ipaddress.IPv4Network(text, strict=False))
        except ValueError:
            raise AclError(f"{source}: white address {item!r:.60} is not an IPv4 address, CIDR or pattern") from None
    return tuple(nets), tuple(patterns)


def parse_acl(text: str, source: str = "<acl>") -> AclConfig:
    """Validate a ``plain_acl.yml``; raises ``AclError`` naming the entry at fault."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AclError(f"{source}: not YAML: {str(exc)[:300]}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise AclError(f"{source}: must be a map with 'accounts'")
    unknown = sorted(str(k) for k in doc if k not in _TOP_KEYS)
    if unknown:
        raise AclError(f"{source}: unknown key(s) {', '.join(unknown)} (known: accounts, globalWhiteRemoteAddresses)")
    raw_accounts = doc.get("accounts") or []
    if not isinstance(raw_accounts, list) or len(raw_accounts) > ACCOUNTS_MAX:
        raise AclError(f"{source}: accounts must be a list (at most {ACCOUNTS_MAX})")
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(raw_accounts):
        account = _account(raw, f"{source}: accounts[{i}]")
        if account.access_key in accounts:
            raise AclError(f"{source}: accounts[{i}]: accessKey {account.access_key!r} is listed twice")
        accounts[account.access_key] = account
    nets, patterns = _white(doc.get("globalWhiteRemoteAddresses"), source)
    return AclConfig(accounts, nets, patterns, hashlib.sha256(text.encode("utf-8", "replace")).hexdigest())


# -- decisions ---------------------------------------------------------------------------------------------
def _owned(account: Account, listed: Mapping[str, Perm], default: Perm, name: str) -> Perm:
    perm = listed.get(name)
    if perm is not None:
        return perm
    return Perm.ANY if account.admin else default


def topic_perm(account: Account, topic: str) -> Perm:
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if topic.startswith(prefix):
            return group_perm(account, topic[len(prefix):])
    return _owned(account, account.topic_perms, account.default_topic_perm, topic)


def group_perm(account: Account, group: str) -> Perm:
    return _owned(account, account.group_perms, account.default_group_perm, group)


def check(
    account: Account,
    *,
    topics: Mapping[str, Perm] | Sequence[tuple[str, Perm]] = (),
    groups: Mapping[str, Perm] | Sequence[tuple[str, Perm]] = (),
    admin: bool = False,
) -> None:
    """Raise ``AuthError(403, ...)`` unless ``account`` holds every needed permission."""
    if admin and not account.admin:
        raise AuthError(403, "NO_PERMISSION", f"{account.access_key!r} is not an admin account")
    # Every request of a signed client runs this: a dict is told from a sequence of pairs without
    # ABCMeta's Python __instancecheck__, and the permissions are compared as ints (Perm's own & and
    # ~ are Python methods of enum.Flag that build a member each; the same bits either way).
    for topic, need in topics.items() if type(topics) is dict or isinstance(topics, Mapping) else topics:
        if int(need) & ~int(topic_perm(account, topic)):
            raise AuthError(403, "NO_PERMISSION", f"{account.access_key!r} may not {_verb(need)} topic {topic!r}")
    for group, need in groups.items() if type(groups) is dict or isinstance(groups, Mapping) else groups:
        if int(need) & ~int(group_perm(account, group)):
            raise AuthError(403, "NO_PERMISSION", f"{account.access_key!r} may not {_verb(need)} group {group!r}")


def check_broker(account: Account, broker_name: str) -> None:
    if broker_name not in account.broker_names:
        raise AuthError(403, "NO_PERMISSION", f"{account.access_key!r} may not register broker group {broker_name!r}")


def _verb(need: Perm) -> str:
    return {Perm.PUB: "publish to", Perm.SUB: "subscribe to"}.get(need, "use")


# -- the file, reloaded on change ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class FileStamp:
    inode: int
    mtime_ns: int
    size: int


class AclWatcher:
    """Holds the rules of ``path``; ``poll()`` re-reads the file when it changed. ``current`` is the
    last good ``AclConfig`` (the constructor raises ``AclError``/``OSError`` if the first read fails)."""

    def __init__(self, path: str, *, rehash_every: int = 10):
        self.path = path
        self._rehash_every = rehash_every
        self._polls = 0
        self._stamp: FileStamp | None = None
        self._last_error: str | None = None
        self.reloads = 0
        self.current = self._read()[1]

    def _read(self) -> tuple[FileStamp, AclConfig]:
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            raw = f.read(ACL_FILE_BYTES_MAX + 1)
        if len(raw) > ACL_FILE_BYTES_MAX:
            raise AclError(f"{self.path}: larger than {ACL_FILE_BYTES_MAX} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise AclError(f"{self.path}: not UTF-8") from None
        stamp = FileStamp(st.st_ino, st.st_mtime_ns, st.st_size)
        self._stamp = stamp
        return stamp, parse_acl(text, self.path)

    def poll(self) -> bool:
        """Reload if the file's stamp (or, every ``rehash_every`` polls, its hash) changed.
        Returns True when new rules took effect."""
        self._polls += 1
        try:
            st = os.stat(self.path)
            stamp = FileStamp(st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self._stamp and self._polls % self._rehash_every:
                return False
            _, cfg = self._read()
        except (OSError, AclError) as exc:
            msg = str(exc)
            if msg != self._last_error:
                log.error("ACL file %s not reloaded, the previous rules stay in force: %s", self.path, msg)
            self._last_error = msg
            return False
        self._last_error = None
        if cfg.digest == self.current.digest:
            return False
        self.current = cfg
        self.reloads += 1
        log.info("ACL reloaded from %s: %d account(s)", self.path, len(cfg.accounts))
        return True

    async def run(self, interval_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.poll()
