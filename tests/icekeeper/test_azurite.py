"""Azurite from the local stack serves the Storage Queue API the moniker transport uses."""

from __future__ import annotations

import uuid

import pytest
from azure.storage.queue import QueueClient

pytestmark = pytest.mark.integration


def test_send_receive_and_delete_on_an_azurite_queue(local_stack) -> None:
    service = local_stack.service("azurite-queue")
    queue = QueueClient.from_connection_string(
        service.connection_string(), f"q-{uuid.uuid4().hex[:12]}", api_version="2026-06-06"
    )
    queue.create_queue()
    try:
        sent = [f'{{"moniker": {index}}}' for index in range(3)]
        for body in sent:
            queue.send_message(body)
        received = list(queue.receive_messages(messages_per_page=32, visibility_timeout=30))
        assert sorted(message.content for message in received) == sorted(sent)
        # Received but not deleted: invisible now, back after the visibility timeout.
        assert list(queue.peek_messages(max_messages=32)) == []
        for message in received:
            queue.delete_message(message)
        assert queue.get_queue_properties().approximate_message_count == 0
    finally:
        queue.delete_queue()
