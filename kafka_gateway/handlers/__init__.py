"""Kafka API handlers, one module per family; importing this package registers them all."""

from kafka_gateway.handlers import admin, fetch, groups, metadata, offsets, operations, produce, sasl, transactions

__all__ = ["admin", "fetch", "groups", "metadata", "offsets", "operations", "produce", "sasl", "transactions"]
