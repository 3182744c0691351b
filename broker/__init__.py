"""The broker: protocol-neutral services under every front door (HTTP, Kafka, console).

Produce (`broker.produce`), group coordination and committed offsets (`broker.coordinator`), the
cluster's view of gateways and owners (`broker.cluster`), wake-ups of waiting fetches
(`broker.notifier`), and connection limits (`broker.connections`). They take plain values, check
authorization, and raise `delta_log.errors.TopiclakeError`; each face decodes its protocol, calls
them and maps the error root to its own codes.
"""
