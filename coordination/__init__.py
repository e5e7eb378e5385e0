"""Coordination: the branch graph and shared facts broadcast between running agents.

:class:`BranchGraph` records how branches forked and merged; :class:`Coordinator` shares
facts between the agents of those branches through a :class:`Transport`:
:class:`InProcessTransport` (the default) or :class:`MqttTransport` (a real MQTT broker);
either can sign what it sends with a namespace's key (:class:`EnvelopeSigner`).

Modules, top to bottom (each imports only those below it; checked by ``lint-imports``):
``coordinator`` (the Coordinator); ``merging`` (merge strategies) and ``envelope`` (wire
models); ``graph`` (BranchGraph), ``mqtt`` and ``transport`` (the transports); ``signing``,
``wire`` (topics and payload checks), ``ordering`` and ``repair`` (per-sender ordering, the
outbox), ``callbacks`` (bounded async ``on_fact`` callbacks). The errors are in
:mod:`marsys_mem.exceptions` with the rest of the library's.
"""

from marsys_mem.coordination.coordinator import Coordinator, attach_memory
from marsys_mem.coordination.envelope import (
    FactCallback,
    FactDelivery,
    FactEnvelope,
    MergeResult,
)
from marsys_mem.coordination.graph import (
    BranchGraph,
    BranchInfo,
    BranchStatus,
    GraphChange,
    MergeStrategy,
)
from marsys_mem.coordination.mqtt import MqttTransport
from marsys_mem.coordination.signing import SIGNING_KEY_ENV, EnvelopeSigner, ReplayWindow
from marsys_mem.coordination.transport import InProcessBroker, InProcessTransport, Transport
from marsys_mem.coordination.wire import DEFAULT_MAX_PAYLOAD, fact_topic, facts_filter

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "SIGNING_KEY_ENV",
    "BranchGraph",
    "BranchInfo",
    "BranchStatus",
    "Coordinator",
    "EnvelopeSigner",
    "FactCallback",
    "FactDelivery",
    "FactEnvelope",
    "GraphChange",
    "InProcessBroker",
    "InProcessTransport",
    "MergeResult",
    "MergeStrategy",
    "MqttTransport",
    "ReplayWindow",
    "Transport",
    "attach_memory",
    "fact_topic",
    "facts_filter",
]
