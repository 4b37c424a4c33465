"""Moniker transports: a transaction-log folder or an Azure Storage Queue, behind one interface."""

from icekeeper.common.config.model import AzureQueueTransport, IcekeeperConfig, TxLogTransport
from icekeeper.common.transports.base import Delivery, MonikerTransport


def open_transport(config: IcekeeperConfig) -> MonikerTransport:
    """The transport the config names."""
    settings = config.transport
    if isinstance(settings, TxLogTransport):
        from icekeeper.common.transports.txlog import TxLogMonikerTransport

        return TxLogMonikerTransport(settings)
    if isinstance(settings, AzureQueueTransport):
        from icekeeper.common.transports.azure_queue import AzureQueueMonikerTransport

        return AzureQueueMonikerTransport(settings)
    raise ValueError(f"unknown transport {settings!r}")


__all__ = ["Delivery", "MonikerTransport", "open_transport"]
