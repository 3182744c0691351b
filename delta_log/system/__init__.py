"""The `_system` tables: committed consumer offsets and consumer group state."""
