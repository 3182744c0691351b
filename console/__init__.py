"""The web console (docs/CONSOLE.md): a face of its own beside the HTTP API and the Kafka listener,
over the same API."""
