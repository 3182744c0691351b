"""topiclake: CLI and Python clients (`Producer`, `AdminClient`)."""

from topiclake.client import AdminClient, Producer, RecordMetadata, TopiclakeClientError

__all__ = ["AdminClient", "Producer", "RecordMetadata", "TopiclakeClientError"]
