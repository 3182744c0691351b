"""topiclake: CLI and Python clients (`Producer`, `Consumer`, `AdminClient`)."""

from topiclake.client import AdminClient, Producer, RecordMetadata, TopiclakeClientError
from topiclake.consumer import Consumer, ConsumerRecord

__all__ = ["AdminClient", "Consumer", "ConsumerRecord", "Producer", "RecordMetadata", "TopiclakeClientError"]
