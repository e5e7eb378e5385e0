"""Coordination: the branch graph and shared facts broadcast between running agents.

:class:`BranchGraph` records how branches forked and merged; :class:`Coordinator` shares
facts between the agents of those branches through a :class:`Transport`:
:class:`InProcessTransport` (the default) or :class:`MqttTransport` (a real MQTT broker);
either can sign what it sends with a namespace's key (:class:`EnvelopeSigner`).
"""

from marsys_mem.coordination.coordinator import Coordinator, attach_memory
from marsys_mem.coordination.envelope import (
    FactCallback,
    FactDelivery,
    FactEnvelope,
    MergeResult,
    inbox_key,
)
from marsys_mem.coordination.graph import (
    BranchGraph,
    BranchInfo,
    BranchStatus,
    GraphChange,
    MergeStrategy,
)
from marsys_mem.coordination.mqtt import MqttTransport
from marsys_mem.coordination.signing import SIGNING_KEY_ENV, EnvelopeSigner, SignatureError
from marsys_mem.coordination.transport import (
    DEFAULT_MAX_PAYLOAD,
    AuthenticationError,
    BranchError,
    CoordinationError,
    InProcessBroker,
    InProcessTransport,
    MergeCycleError,
    Transport,
    TransportError,
    UnknownBranchError,
    fact_topic,
    facts_filter,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "SIGNING_KEY_ENV",
    "AuthenticationError",
    "BranchError",
    "BranchGraph",
    "BranchInfo",
    "BranchStatus",
    "CoordinationError",
    "Coordinator",
    "EnvelopeSigner",
    "FactCallback",
    "FactDelivery",
    "FactEnvelope",
    "GraphChange",
    "InProcessBroker",
    "InProcessTransport",
    "MergeCycleError",
    "MergeResult",
    "MergeStrategy",
    "MqttTransport",
    "SignatureError",
    "Transport",
    "TransportError",
    "UnknownBranchError",
    "attach_memory",
    "fact_topic",
    "facts_filter",
    "inbox_key",
]
